"""The Lua scripts of the remote tier: each a compare-and-act on one key, atomic on the server.

Redis has no compare-and-set of its own before 8.x; a script is the way to write "only if the
value is still what I saw" (as the Redlock and redis-py lock recipes release a lock). One key
each, so that a Redis Cluster runs every script on the node of that key's slot. Commands a
script calls are checked against the user's ACL like any other (docs/remote.md lists them).
"""

from __future__ import annotations

from ._client import Script

__all__ = ["REFRESH", "RELEASE", "RENEW", "REPLACE"]

# KEYS[1]: an entry; ARGV: SHA1 of the damaged value seen there, the new value, TTL in ms (0: none).
# Writes only where the key is still absent or still holds that damaged value: a good entry
# another host stored meanwhile is never overwritten.
REPLACE = Script(b"""
local v = redis.call('GET', KEYS[1])
if v and redis.sha1hex(v) ~= ARGV[1] then return 0 end
if ARGV[3] == '0' then redis.call('SET', KEYS[1], ARGV[2]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
""")

# KEYS[1]: an entry; ARGV: its TTL in ms, the refresh interval in ms. Extends the TTL only when
# more than an interval of it has passed, so the hosts of a fleet write at most once per interval.
REFRESH = Script(b"""
local left = redis.call('PTTL', KEYS[1])
if left >= 0 and left < tonumber(ARGV[1]) - tonumber(ARGV[2]) then return redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return 0
""")

# KEYS[1]: a build lease; ARGV: the holder's token, the expiry in ms. Only the holder renews it.
RENEW = Script(b"""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
""")

# KEYS[1]: a build lease; ARGV: the holder's token. Only the holder deletes it: a lease that
# expired and was taken by another host stays that host's.
RELEASE = Script(b"""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")
