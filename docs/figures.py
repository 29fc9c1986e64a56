"""The documentation's figures and result tables, made from committed outputs only.

    python docs/figures.py          # what docs/conf.py runs before every build
    python docs/figures.py --readme # the README's figure, docs/_static/readme_stability.png (committed)

Reads the raw benchmark outputs (``bench/results/*.txt``, printed by the ``bench`` scripts with the
commands of BENCHMARKS.md) and the committed per-run metrics of the examples
(``examples/results/*.json``, copied there by ``python -m examples.results collect``), and writes
into ``docs/_generated/`` (git-ignored):

* PNG figures: the numerical stability of every distribution against the temperature, the scaling
  in K and in the batch, and each example's learning curves (the "validation" series of its runs);
* reStructuredText fragments (``*.inc``, pulled in with ``.. include::``): the result tables of the
  examples, with the same rows and columns as ``python -m examples.results table``, and the tables
  of the benchmark outputs that the pages show.

Nothing here is typed in by hand: a number on the pages is a number in one of those files.
"""

import glob
import json
import os
import sys
import tempfile
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH = os.path.join(ROOT, "bench", "results")
RESULTS = os.path.join(ROOT, "examples", "results")
OUT = os.path.join(HERE, "_generated")

OURS = ("pyro_concrete.", "numpyro_concrete.")
PPL_NAMES = {"pyro": "Pyro", "numpyro": "NumPyro"}


# ----------------------------------------------------------------------------- output


def _write(name, data):
    """Write ``OUT/name`` atomically (a build beside another never reads half a file)."""
    os.makedirs(OUT, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=OUT, prefix=".tmp-")
    with os.fdopen(fd, mode) as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(OUT, name))


def _save(fig, name):
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    _write(name, buffer.getvalue())


def _cell(text):
    text = str(text).replace("\n", " ")
    return text if text else r"\ "  # an empty list-table cell must still hold something


def list_table(caption, header, rows, source):
    """A reStructuredText list-table with a caption and a line naming the file(s) it came from."""
    lines = [f".. list-table:: {caption}", "   :header-rows: 1", "   :class: longtable", ""]
    for row in [header] + rows:
        lines.append(f"   * - {_cell(row[0])}")
        lines.extend(f"     - {_cell(value)}" for value in row[1:])
    lines += ["", f"*Source:* {source}", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- parsing


def markdown_tables(path):
    """The Markdown tables of a bench output: [(context, header, rows)], ``context`` the last line
    before the table that is neither a table row nor empty (a section name such as ``numpyro``); a
    ``#`` line between two rows is a note inside the table."""
    tables, context, current = [], "", None
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if line.startswith("|"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if current is None:
                    current = (context, cells, [])
                    tables.append(current)
                elif not all(set(c) <= set("-: ") for c in cells):
                    current[2].append(cells)
            elif current is not None and line.startswith("#"):
                continue  # a note printed inside a table (bench.kernels' retried validation errors)
            else:
                current = None
                if line.strip():
                    context = line.strip().lstrip("#").strip()
    return tables


def _percent(text):
    return float(text.rstrip("%"))


def stability_by_temperature():
    """{(distribution, dtype): {"T": [...], column: [...]}} from stability_by_t.txt."""
    (_, header, rows), = markdown_tables(os.path.join(BENCH, "stability_by_t.txt"))
    series = defaultdict(lambda: defaultdict(list))
    for row in rows:
        values = dict(zip(header, row))
        s = series[(values["distribution"], values["dtype"])]
        s["T"].append(float(values["T"]))
        for column in ("non-finite", "wrong", "rejected", "bad grad"):
            s[column].append(_percent(values[column]))
    return series


# ----------------------------------------------------------------------------- numerics


def _is_binary(distribution):
    return any(word in distribution for word in ("Bernoulli", "BinConcrete"))


def _is_ours(distribution):
    return distribution.startswith(OURS)


ANCHOR_STYLES = {}


def _style(distribution):
    """A fixed color and marker per anchor (the same in every panel); ours all alike: a thick black line
    drawn underneath, so that an anchor on it still shows its markers."""
    if _is_ours(distribution):
        return dict(color="black", lw=4, ls="-", alpha=0.8, zorder=1)
    if distribution not in ANCHOR_STYLES:
        palette = ["tab:red", "tab:orange", "tab:purple", "tab:blue", "tab:green", "tab:brown", "tab:pink", "tab:olive",
                   "tab:cyan", "tab:gray"]
        markers = ["o", "s", "^", "v", "D", "P", "X", "<", ">", "*"]
        i = len(ANCHOR_STYLES)
        ANCHOR_STYLES[distribution] = dict(color=palette[i % len(palette)], marker=markers[i % len(markers)], lw=1.3,
                                           ls="--", ms=7, mfc="none", mew=1.5, zorder=2)
    return ANCHOR_STYLES[distribution]


def _ours_label(names):
    kinds = sorted({n.split(".", 1)[1] for n in names})
    return f"this library: {', '.join(kinds)} (pyro_concrete and numpyro_concrete; {len(names)} curves)"


def stability_figures(readme=False):
    """The docs' two figures; with ``readme``, only the float32 row of the first, as the committed
    ``docs/_static/readme_stability.png`` that the README shows."""
    import matplotlib.pyplot as plt

    series = stability_by_temperature()
    dtypes = ["float32"] if readme else sorted({dtype for _, dtype in series})
    figures = (
        (("non-finite", "wrong"), "numerics_stability.png", "% of own samples: log_prob\nnon-finite or wrong"),
        (("bad grad",), "numerics_gradients.png", "% of grid cells (K values):\nnon-finite gradient"),
    )
    for column_set, name, ylabel in figures[:1] if readme else figures:
        fig, axes = plt.subplots(len(dtypes), 2, figsize=(12, 4.2 * len(dtypes)), sharex=True, squeeze=False)
        for i, dtype in enumerate(dtypes):
            for j, binary in enumerate((False, True)):
                ax = axes[i][j]
                ours = []
                for (distribution, d), s in sorted(series.items()):
                    if d != dtype or _is_binary(distribution) != binary:
                        continue
                    y = np.sum([s[c] for c in column_set], axis=0)
                    if _is_ours(distribution):
                        ours.append(distribution)
                        ax.plot(s["T"], y, **_style(distribution), label=_ours_label(ours) if len(ours) == 1 else None)
                    else:
                        ax.plot(s["T"], y, **_style(distribution), label=distribution)
                if i == len(dtypes) - 1:  # one legend per column, below it: the styles are the same in every row
                    handles, labels = ax.get_legend_handles_labels()
                    labels = [_ours_label(ours) if label.startswith("this library") else label for label in labels]
                    ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=1)
                ax.set_xscale("log")
                ax.set_ylim(-4, 104)
                ax.set_title(f"{'binary (relaxed Bernoulli)' if binary else 'n-ary (relaxed categorical)'}, {dtype}",
                             fontsize=10)
                ax.grid(alpha=0.3)
                if j == 0:
                    ax.set_ylabel(ylabel, fontsize=9)
                if i == len(dtypes) - 1:
                    ax.set_xlabel("temperature T")
        fig.suptitle("bench/results/stability_by_t.txt (python -m bench.stability --by-temperature): "
                     "K in 2..10^5, logits over [-50, 50]", fontsize=10)
        fig.tight_layout()
        if readme:
            import matplotlib.pyplot as plt

            fig.savefig(os.path.join(HERE, "_static", "readme_stability.png"), format="png", dpi=70, bbox_inches="tight",
                        metadata={"Software": None})
            plt.close(fig)
        else:
            _save(fig, name)


def stability_table():
    (_, header, rows), = markdown_tables(os.path.join(BENCH, "stability.txt"))
    _write("stability.inc", list_table(
        "Own samples over the whole grid (T 0.01-1000 x K 2-10^5): % non-finite, % wrong, % of cells rejected by "
        "validation, % of cells with a non-finite gradient",
        header, rows, "``bench/results/stability.txt``, printed by ``python -m bench.stability``"))


def kernels_table():
    """BENCHMARKS section 1's summary: fwd+grad / floor, min-max over the cells, per backend and contestant."""
    spans = defaultdict(list)
    for context, header, rows in markdown_tables(os.path.join(BENCH, "kernels.txt")):
        for row in rows:
            values = dict(zip(header, row))
            workloads = "W4 (launch-bound)" if values["workload"].startswith("W4") else "W1-W3"
            spans[(context, values["contestant"], workloads)].append(float(values["fwd+grad / floor"].rstrip("x")))
    rows = [[backend, contestant, workloads, f"{min(v):.2f}-{max(v):.2f}x", str(len(v))]
            for (backend, contestant, workloads), v in spans.items()]
    _write("kernels.inc", list_table(
        "d.log_prob(d.rsample()).sum() with its gradient, over the floor (the same math written by hand) of the same "
        "framework: min-max over the cells (workloads x 4 distributions)",
        ["backend", "contestant", "workloads", "fwd+grad / floor", "cells"], rows,
        "``bench/results/kernels.txt``, printed by ``python -m bench.kernels --repetitions 15``"))


def svi_table():
    """BENCHMARKS section 3: one SVI step of the examples' discrete VAE against hand-written loops."""
    (_, header, rows), = markdown_tables(os.path.join(BENCH, "svi.txt"))
    _write("svi.inc", list_table(
        "One SVI step of the discrete VAE (200H~784V), binary, Fashion-MNIST, batch 64, m = 1: median ms per step, "
        "and the median ratio to each hand-written floor in the same repetition",
        header, rows, "``bench/results/svi.txt``, printed by ``python -m bench.svi``"))


def scaling_figure():
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for context, header, rows in markdown_tables(os.path.join(BENCH, "scaling.txt")):
        values = [dict(zip(header, row)) for row in rows]
        elements = [int(v["elements"]) for v in values]
        style = dict(marker="o", ls="-" if "over K" in context else "--")
        axes[0].plot(elements, [float(v["ms"]) for v in values], label=context, **style)
        memory = [(e, int(v["peak MB"])) for e, v in zip(elements, values) if int(v["peak MB"]) > 0]
        if memory:
            axes[1].plot(*zip(*memory), label=context, **style)
    for ax, ylabel in zip(axes, ("ms, forward + gradient", "peak MB above baseline (0 MB not shown)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("elements (batch x K)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("bench/results/scaling.txt (python -m bench.scaling): Concrete, T = 0.5, float32", fontsize=10)
    fig.tight_layout()
    _save(fig, "scaling.png")


def estimators_tables():
    """BENCHMARKS section 6 (step time per estimator, both PPLs side by side) and section 5 (variance)."""
    by_ppl = {context: {row[0]: row[1:] for row in rows}
              for context, _, rows in markdown_tables(os.path.join(BENCH, "estimators.txt"))}
    estimators = list(next(iter(by_ppl.values())))
    header = ["estimator"] + [f"{PPL_NAMES.get(p, p)} {c}" for p in by_ppl for c in ("ms/step", "vs Concrete")]
    rows = [[e] + [v for p in by_ppl for v in by_ppl[p].get(e, ["", ""])] for e in estimators]
    _write("estimators_time.inc", list_table(
        "Step time of the discrete VAE example per --estimator, (200H~784V) binary, Fashion-MNIST, batch 64, m = 1: "
        "median ms per step and the median ratio to the same PPL's Concrete step",
        header, rows,
        "``bench/results/estimators.txt``, printed by ``python -m bench.estimators --repetitions 7 --steps 30``"))
    (_, header, rows), = markdown_tables(os.path.join(BENCH, "variance.txt"))
    _write("estimators_variance.inc", list_table(
        "log10 of the gradient variance of the encoder's output layer (200 draws on one batch), the distance of its "
        "mean from DisARM's (bias) against its Monte Carlo level (noise), and the discrete ELBO on the batch",
        header, rows,
        "``bench/results/variance.txt``, printed by ``python -m bench.variance --out bench/results``"))
    with open(os.path.join(BENCH, "variance.png"), "rb") as f:
        _write("variance.png", f.read())


# ----------------------------------------------------------------------------- examples


def load_results():
    results = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        with open(path) as f:
            results[os.path.basename(path)[: -len(".json")]] = json.load(f)
    return results


def _rows(results, prefix):
    return results_module().runs_of(results, prefix)


def _objective(m):
    return results_module().objective(m)


def _training(training):
    return results_module().training_label(training)


def results_module():
    """``examples.results``: the run definitions and the tables of the committed runs."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from examples import results

    return results


def _source(prefix):
    return f"``examples/results/{prefix}*.json`` (the committed metrics of the runs listed by ``python -m examples.results list``)"


def example_tables(results):
    """The examples' result tables (``examples.results.tables``, which ``python -m examples.results
    table`` prints in Markdown), as list-tables."""
    for table in results_module().tables(results):
        _write(f"{table.key}.inc", list_table(table.caption, table.header, table.rows, _source(table.prefix)))


ESTIMATOR_ORDER = ["Concrete, L_1", "Concrete, L_5", "REINFORCE, L_1", "VIMCO, L_5", "REBAR, L_1", "RELAX, L_1",
                   "DisARM, L_1", "Gumbel-Rao, L_1"]


def estimators_nll_table(results):
    """The discrete VAE's runs pivoted by objective: test NLL / last validation -L_1 of the discrete
    graph, one column per (data, nodes, PPL); the same JSON as the examples' tables."""
    columns, cells = [], {}
    for prefix, data in (("digits-dvae", "digits"), ("fmnist-dvae", "Fashion-MNIST")):
        for _, m in _rows(results, prefix):
            if data == "Fashion-MNIST" and (m["arity"] != 2 or m["steps"] != 100000):
                continue  # the 4-ary and the 300k-step runs have no counterpart: in the Fashion-MNIST table
            column = (data, m["arity"], m["backend"])
            if column not in columns:
                columns.append(column)
            cells[(_objective(m), column)] = f"{m['test_nll']:.2f} / {m['validation'][-1][1]:.2f}"
    columns.sort(key=lambda c: (c[0] != "digits", c[1], c[2] != "numpyro"))
    header = ["objective"] + [f"{data} {arity}-ary {PPL_NAMES[ppl]}" for data, arity, ppl in columns]
    rows = [[objective] + [cells.get((objective, column), "—") for column in columns] for objective in ESTIMATOR_ORDER]
    _write("estimators_nll.inc", list_table(
        "Discrete VAE, test NLL / validation -L_1 at the end (nats), both of the discrete graph: digits 20k steps, "
        "test -L_1000; Fashion-MNIST 100k steps, test -L_100 (— : not run)",
        header, rows, _source("{digits,fmnist}-dvae-")))


_LINESTYLE = {"numpyro": "-", "pyro": "--"}


def _colors(keys):
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    return {key: cmap(i % 10) for i, key in enumerate(keys)}


def _plot_runs(ax, runs, key, colors, **kw):
    """Each run's "validation" series: color by ``key(metrics)``, solid NumPyro, dashed Pyro."""
    for _, m in runs:
        steps, values = zip(*m["validation"])
        ax.plot(steps, values, ls=_LINESTYLE[m["backend"]], color=colors[key(m)], **kw)


def _finish(ax, title, ylabel):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel, fontsize=9)
    ax.grid(alpha=0.3)


def _legend(fig, colors, ncol):
    """One legend under the figure: the colors, then the two PPLs' line styles."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=color, lw=2, label=str(key)) for key, color in colors.items()]
    handles += [Line2D([], [], color="black", ls=_LINESTYLE[ppl], label=PPL_NAMES[ppl]) for ppl in ("numpyro", "pyro")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8.5, frameon=False)


def _figure(ncols, width, height=4.2):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def example_curves(results):
    # discrete VAE on the digits: one panel per arity, one color per objective
    runs = _rows(results, "digits-dvae")
    colors = _colors(sorted({_objective(m) for _, m in runs}))
    fig, axes = _figure(3, 15)
    for ax, arity in zip(axes, (2, 4, 8)):
        _plot_runs(ax, [(n, m) for n, m in runs if m["arity"] == arity], _objective, colors)
        _finish(ax, f"{arity}-ary nodes", "validation -L_1 of the discrete graph (nats)")
    fig.suptitle("Discrete VAE, 8x8 digits: examples/results/digits-dvae-*.json", fontsize=10)
    fig.tight_layout()
    _legend(fig, colors, 5)
    _save(fig, "dvae_digits.png")

    runs = _rows(results, "fmnist-dvae")

    def fmnist_key(m):
        return f"{m['arity']}-ary {_objective(m)}, {m['steps'] // 1000}k steps"

    colors = _colors(sorted({fmnist_key(m) for _, m in runs}))
    fig, (ax,) = _figure(1, 12, 5)
    _plot_runs(ax, runs, fmnist_key, colors)
    ax.set_ylim(top=min(300, ax.get_ylim()[1]))
    _finish(ax, "Discrete VAE, Fashion-MNIST: examples/results/fmnist-dvae-*.json", "validation -L_1 of the discrete graph (nats)")
    fig.tight_layout()
    _legend(fig, colors, 4)
    _save(fig, "dvae_fmnist.png")

    def particles(m):
        return f"L_{m['particles']}^SP"

    fig, axes = _figure(2, 12)
    colors = _colors(["L_1^SP", "L_5^SP"])
    for ax, dataset in zip(axes, ("digits", "fmnist")):
        _plot_runs(ax, _rows(results, f"{dataset}-structured"), particles, colors, marker="o", ms=3)
        _finish(ax, f"{dataset}: examples/results/{dataset}-structured-*.json", "validation -L_10^SP of the discrete graph (nats)")
    fig.suptitle("Structured prediction", fontsize=10)
    fig.tight_layout()
    _legend(fig, colors, 4)
    _save(fig, "structured.png")

    def training(m):
        return _training(m["training"])

    training_colors = {_training("enumerate"): "tab:blue", _training("relaxed"): "tab:orange"}
    seeds, runs = dict(lw=1, alpha=0.8), dict(marker="o", ms=3)
    for prefix, name, ylabel, title, style in (
        ("digits-mixture", "mixture.png", "test log p(x) per image (exact)",
         "Bernoulli mixture of the digits, one line per seed: examples/results/digits-mixture-*.json", seeds),
        ("iris-gmm", "gmm.png", "log p(x | globals at the guide's median) per flower",
         "Gaussian mixture of the Iris flowers, one line per seed: examples/results/iris-gmm-*.json", seeds),
        ("digits-hmm", "hmm.png", "test log p(x) per image (exact)",
         "Hidden Markov model of the digits' rows: examples/results/digits-hmm-*.json", runs),
    ):
        fig, (ax,) = _figure(1, 9, 4.5)
        _plot_runs(ax, _rows(results, prefix), training, training_colors, **style)
        _finish(ax, title, ylabel)
        fig.tight_layout()
        _legend(fig, training_colors, 4)
        _save(fig, name)

    def strength(m):
        return f"lambda = {m['l0']:g}"

    runs = sorted(_rows(results, "digits-l0"), key=lambda item: (item[1]["l0"], item[1]["backend"]))
    colors = _colors(sorted({strength(m) for _, m in runs}, key=lambda label: float(label.split()[-1])))
    fig, axes = _figure(2, 13, 4.5)
    _plot_runs(axes[0], runs, strength, colors, marker="o", ms=3)
    _finish(axes[0], "validation cross-entropy per image, deterministic gates", "nats")
    for _, m in runs:
        kept, accuracy = zip(*m["accuracy_vs_active"])
        axes[1].plot(kept, accuracy, ls=_LINESTYLE[m["backend"]], color=colors[strength(m)])
    axes[1].set_xscale("log")
    _finish(axes[1], "test accuracy with only the k largest gates kept (accuracy_vs_active)", "test accuracy")
    axes[1].set_xlabel("gates kept (k)")
    fig.suptitle("Hard Concrete pruning of a 64-100-10 classifier: examples/results/digits-l0-*.json", fontsize=10)
    fig.tight_layout()
    _legend(fig, colors, 5)
    _save(fig, "l0.png")


def example_commands():
    """The committed runs' commands, per example, as ``python -m examples.results list`` prints them
    (from its run definitions, ``examples.results.RUNS``), as bash code blocks."""
    runs = results_module()

    for example in ("dvae", "structured", "mixture", "gmm", "hmm", "l0"):
        lines = []
        for name, (module, options) in runs.RUNS.items():
            if module.rsplit("_", 1)[0] == example:
                lines.append(f"   python -m examples.{module} {' '.join(options)} --out runs/{name}")
        _write(f"commands_{example}.inc", ".. code-block:: bash\n\n" + "\n".join(sorted(lines)) + "\n")


# ----------------------------------------------------------------------------- main


def main(argv=None):
    import matplotlib

    matplotlib.use("Agg")
    if "--readme" in (sys.argv[1:] if argv is None else argv):
        return stability_figures(readme=True)
    stability_figures()
    stability_table()
    kernels_table()
    svi_table()
    scaling_figure()
    estimators_tables()
    results = load_results()
    example_tables(results)
    estimators_nll_table(results)
    example_commands()
    example_curves(results)


if __name__ == "__main__":
    sys.exit(main())
