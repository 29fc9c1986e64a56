"""What every example script shares and that has nothing to do with the PPL: command-line options,
atomic checkpoints, stopping cleanly on SIGINT/SIGTERM, the progress bar, metrics and plots."""

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time

import numpy as np


def common_arguments(parser, *, steps, batch_size, lr):
    """The options every example takes."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=steps, help="optimization steps")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--lr", type=float, default=lr, help="Adam learning rate")
    parser.add_argument("--device", default=None, help="cpu or cuda/gpu (default: a GPU if there is one)")
    parser.add_argument("--out", default=None, help="directory for metrics.json, plots and checkpoints")
    parser.add_argument("--checkpoint-every", type=int, default=1000, help="steps between checkpoints (needs --out)")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The module docstring as written; defaults shown where an option has one."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def parser_for(description):
    return argparse.ArgumentParser(description=description, formatter_class=_HelpFormatter)


def fail(message):
    """Exit with a one-line error instead of a traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


# ----------------------------------------------------------------------------- checkpoints


def atomic_write(path, data):
    """Write ``data`` (bytes) to ``path`` so that a crash leaves either the old or the new file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def checkpoint_path(out):
    return None if out is None else os.path.join(out, "checkpoint.bin")


class StopRequests:
    """Turns SIGINT and SIGTERM into a flag the training loop checks between steps, so that an
    interrupted run saves a checkpoint before it exits."""

    def __init__(self):
        self.signal = None

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    @property
    def requested(self):
        return self.signal is not None


class Progress:
    """A tqdm bar with the running (exponentially averaged) loss, or nothing with ``disable``."""

    def __init__(self, total, initial, disable):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, disable=disable, dynamic_ncols=True, unit="step")
        self.running = None

    def update(self, loss):
        self.running = loss if self.running is None else 0.98 * self.running + 0.02 * loss
        self.bar.set_postfix(loss=f"{self.running:.3f}", refresh=False)
        self.bar.update(1)

    def close(self):
        self.bar.close()


# ----------------------------------------------------------------------------- outputs


def write_metrics(out, metrics):
    if out is not None:
        atomic_write(os.path.join(out, "metrics.json"), json.dumps(metrics, indent=2, sort_keys=True).encode())


def plot_learning_curve(out, losses, evaluations=(), ylabel="loss per data point"):
    """losses: one training loss per step; evaluations: (step, value) pairs drawn as points."""
    if out is None or not len(losses):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = np.asarray(losses, dtype=float)
    window = max(1, len(losses) // 200)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.arange(len(smooth)) + window, smooth, lw=1, label=f"training (mean of {window} steps)")
    if len(evaluations):
        steps, values = zip(*evaluations)
        ax.plot(steps, values, "o-", ms=3, label="validation, discrete graph")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "learning_curve.png"), dpi=120)
    plt.close(fig)


def save_image_grid(out, filename, rows, image_shape, row_titles):
    """rows: a list of (n, height * width) arrays in [0, 1], drawn one row of images each."""
    if out is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), n, figsize=(n * 0.8, len(rows) * 0.9), squeeze=False)
    for i, (row, title) in enumerate(zip(rows, row_titles)):
        for j in range(n):
            ax = axes[i, j]
            ax.axis("off")
            if j < len(row):
                ax.imshow(np.asarray(row[j]).reshape(image_shape), cmap="gray", vmin=0, vmax=1)
        axes[i, 0].set_title(title, fontsize=7, loc="left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, filename), dpi=120)
    plt.close(fig)


class Clock:
    """Wall time of the training loop, accumulated over resumed runs, excluding what runs in
    ``paused()`` (evaluation, checkpoints). Wall time, not time inside the step call: with JAX's
    asynchronous dispatch the device keeps computing while Python is elsewhere in the loop."""

    def __init__(self, elapsed=0.0):
        self._elapsed = elapsed
        self._since = time.perf_counter()

    @property
    def elapsed(self):
        return self._elapsed + time.perf_counter() - self._since

    @contextlib.contextmanager
    def paused(self):
        self._elapsed = self.elapsed
        try:
            yield
        finally:
            self._since = time.perf_counter()


def plot_accuracy_vs_active(out, curve, active, test_accuracy, hidden):
    """The L0 examples' accuracy_vs_active_gates.png: test accuracy with the k largest gates kept,
    against k, and the trained net's own point."""
    if out is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ks, accuracies = zip(*curve)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, accuracies, lw=1, label="the k largest deterministic gates kept")
    ax.plot([active], [test_accuracy], "o", color="C3", label=f"trained net: {active} of {hidden} gates open")
    ax.set_xlabel("active gates (hidden units kept)")
    ax.set_ylabel("test accuracy")
    ax.set_xscale("log")
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= hidden]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "accuracy_vs_active_gates.png"), dpi=120)
    plt.close(fig)
