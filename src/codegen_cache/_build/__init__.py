"""Whole builds through the cache: codegen_cache.build, its index, lowering, MetaSchedule."""
