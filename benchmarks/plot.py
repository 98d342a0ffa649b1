"""The summary figure of a run (matplotlib, Agg backend): what run.py --plot draws."""

from __future__ import annotations

from report import rows_of, value

__all__ = ["plot"]


def plot(results: dict, path: str) -> None:
    """Draw the summary figure (matplotlib, Agg) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    rows = rows_of(results)
    ax = axes[0][0]
    series = [("floor", "floor"), ("disk", "disk hit"), ("memory", "memory hit"), ("files", "file cache hit"),
              ("miss", "cold (miss)")]
    width = 0.8 / len(series)
    labels = [f"{r['kernel']}\n{r['codegen']}" for r in rows]
    for i, (name, label) in enumerate(series):
        vals = []
        for r in rows:
            v = value(r, name) if name != "floor" or r.get("loaded", True) else value(r, "floor_noload")
            vals.append(v * 1e3 if v else float("nan"))
        ax.bar([j + i * width for j in range(len(rows))], vals, width, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("ms (log)")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels, fontsize=6, rotation=90)
    ax.set_title("1. hit vs floor vs cold")
    ax.legend(fontsize=7)

    ax = axes[0][1]
    st = results.get("scaling", {}).get("store")
    if st:
        for c in st["cases"]:
            for cache, style in (("ours", "-o"), ("files", "--s")):
                xs = [n for n in st["sizes"] if f"{cache}/{n}" in c["t"]]
                if xs:
                    ax.plot(xs, [c["t"][f"{cache}/{n}"]["median"] * 1e6 for n in xs], style,
                            label=f"{c['case']} ({cache})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("entries in the store")
        ax.set_ylabel("disk hit, us (log)")
        ax.legend(fontsize=7)
    ax.set_title("2. hit latency vs store size")

    ax = axes[1][0]
    keys = results.get("scaling", {}).get("keys", {})
    for label, k in keys.items():
        ax.plot(k["statements"], [h * 1e3 for h in k["hash"]], "-o", label=f"{label}: structural hash")
        ax.plot(k["statements"], [h * 1e3 for h in k["key"]], ":", label=f"{label}: full key")
    ax.set_xlabel("statements in the kernel body")
    ax.set_ylabel("ms")
    ax.set_title("2b. key cost vs IR size")
    if keys:
        ax.legend(fontsize=7)

    ax = axes[1][1]
    ct = results.get("contention")
    if ct:
        procs = [r["procs"] for r in ct["runs"]]
        for phase, color in (("hit", "tab:blue"), ("miss", "tab:orange")):
            ax.plot(procs, [r[phase]["throughput"] for r in ct["runs"]], "-o", color=color, label=f"{phase} ops/s")
        ax.set_xlabel("processes")
        ax.set_ylabel("ops/s (all processes)")
        ax.set_xticks(procs)
        ax2 = ax.twinx()
        for phase, color in (("hit", "tab:blue"), ("miss", "tab:orange")):
            ax2.plot(procs, [r[phase]["p99"] * 1e3 for r in ct["runs"]], "--", color=color, label=f"{phase} p99")
        ax2.set_ylabel("p99 ms (dashed)")
        ax.legend(fontsize=7, loc="upper left")
    ax.set_title("3. contention on shared keys")
    goals = results.get("goals", [])
    n_pass = sum(g["status"] == "PASS" for g in goals)
    n_judged = sum(g["status"] != "N/A" for g in goals)
    fig.suptitle(f"tvm-codegen-cache benchmarks ({results.get('mode', '')}, {results['machine'].get('date', '')}, "
                 f"{results['machine'].get('nproc')} cores): {n_pass}/{n_judged} goals pass", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=60)
    plt.close(fig)
