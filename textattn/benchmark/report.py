"""The benchmark's outputs: results.csv (one row per point, COLUMNS), results.md (pivot tables of
step time and peak memory, then every point), time_vs_length.png and memory_vs_length.png, and the
compact table printed as points finish."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence

COLUMNS = ("variant", "attention", "implementation", "seq_len", "batch_size", "mode", "dtype",
           "embed_dim", "num_heads", "num_layers", "status", "compile_s", "median_ms", "p90_ms",
           "min_ms", "first_call_ms", "tokens_per_s", "examples_per_s", "peak_bytes", "peak_source",
           "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "rss_peak_bytes",
           "flops", "max_abs_diff", "warmup", "repeats", "lengths", "platform", "load_1m",
           "kernel", "attention_tflops", "model_tflops", "mfu_pct", "peak_tflops", "pct_of_peak",
           "bytes_accessed", "achieved_tbps", "peak_tbps", "pct_of_bandwidth", "core_bytes",
           "core_tbps", "pct_core_bandwidth", "mesh",
           "comm_layer_bytes", "comm_formula_bytes", "comm_step_bytes", "ring_blocks", "message")
OUTPUTS = ("results.csv", "results.md", "time_vs_length.png", "memory_vs_length.png")


# What a row's peak_bytes is, by its peak_source (a failed point has none).
PEAK_SOURCES = {"memory_stats": "device memory_stats peak_bytes_in_use",
                "memory_analysis": "memory_analysis argument + output + temp - alias bytes"}


def _number(value) -> float | None:
  if value is None or value == "":
    return None
  try:
    value = float(value)
  except (TypeError, ValueError):
    return None
  return None if math.isnan(value) else value


def _format(value, kind: str) -> str:
  value = _number(value)
  if value is None:
    return "-"
  if kind == "ms":
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"
  if kind == "s":
    return f"{value:.2f}"
  if kind == "rate":
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
  if kind == "mib":
    value /= 2**20
    return f"{value:,.1f}" if value >= 10 else f"{value:.2g}"
  if kind == "gflop":
    return f"{value / 1e9:,.2f}"
  if kind == "diff":
    return f"{value:.1e}"
  return str(value)


_TABLE = (("variant", "variant", 20, None), ("seq_len", "L", 6, None),
          ("status", "status", 7, None), ("compile_s", "compile s", 9, "s"),
          ("median_ms", "median ms", 9, "ms"), ("p90_ms", "p90 ms", 8, "ms"),
          ("tokens_per_s", "tokens/s", 10, "rate"), ("examples_per_s", "examples/s", 10, "rate"),
          ("peak_bytes", "peak MiB", 9, "mib"), ("flops", "GFLOP", 9, "gflop"))


def table_header() -> str:
  return "  ".join(f"{title:>{width}}" for _, title, width, _ in _TABLE)


def table_line(row: dict) -> str:
  cells = [str(row[key]) if kind is None else _format(row[key], kind)
           for key, _, _, kind in _TABLE]
  line = "  ".join(f"{cell:>{width}}" for cell, (_, _, width, _) in zip(cells, _TABLE))
  if row["status"] != "ok" and row.get("message"):
    line += f"  {row['message'][:120]}"
  return line


def write_csv(rows: Sequence[dict], path: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
      writer.writerow({column: row.get(column, "") for column in COLUMNS})
  os.replace(tmp, path)


def read_csv(path: str) -> list[dict]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _pivot(rows: Sequence[dict], key: str, kind: str) -> list[str]:
  variants = list(dict.fromkeys(row["variant"] for row in rows))
  lengths = sorted({int(row["seq_len"]) for row in rows})
  cell = {(row["variant"], int(row["seq_len"])): row for row in rows}
  lines = ["| L | " + " | ".join(variants) + " |", "|---:|" + "---:|" * len(variants)]
  for length in lengths:
    cells = []
    for variant in variants:
      row = cell.get((variant, length))
      if row is None:
        cells.append("")
      elif row["status"] != "ok":
        cells.append(row["status"])
      else:
        cells.append(_format(row[key], kind))
    lines.append(f"| {length} | " + " | ".join(cells) + " |")
  return lines


def write_markdown(rows: Sequence[dict], path: str, command: str, sweep_settings: str) -> None:
  first = rows[0] if rows else {}
  lines = [f"# Sequence-length benchmark: {first.get('mode', '')}", "",
           f"`{command}`", "",
           f"batch {first.get('batch_size')}, embed {first.get('embed_dim')}, "
           f"{first.get('num_heads')} heads, {first.get('num_layers')} layer(s), "
           f"{first.get('dtype')}; {sweep_settings}; platform {first.get('platform') or '?'}. "
           "peak = "
           + (" / ".join(PEAK_SOURCES.get(source, source) for source in sorted(
               {row.get("peak_source") for row in rows if row.get("peak_source")}))
              or "not measured") + ".", "",
           "## Median step time (ms)", "", *_pivot(rows, "median_ms", "ms"), "",
           "## Peak memory (MiB)", "", *_pivot(rows, "peak_bytes", "mib"), "",
           "## All points", "",
           ("| variant | L | status | compile s | calls | median ms | p90 ms | first ms | tokens/s "
            "| examples/s | peak MiB | RSS MiB | GFLOP | max abs diff | load | message |"),
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
  for row in rows:
    message = str(row.get("message", "")).replace("|", "/")
    calls = f"{row['warmup']}+{row['repeats']}" if row["status"] == "ok" else "-"
    lines.append(
        f"| {row['variant']} | {row['seq_len']} | {row['status']} "
        f"| {_format(row['compile_s'], 's')} "
        f"| {calls} "
        f"| {_format(row['median_ms'], 'ms')} | {_format(row['p90_ms'], 'ms')} "
        f"| {_format(row['first_call_ms'], 'ms')} | {_format(row['tokens_per_s'], 'rate')} "
        f"| {_format(row['examples_per_s'], 'rate')} | {_format(row['peak_bytes'], 'mib')} "
        f"| {_format(row['rss_peak_bytes'], 'mib')} | {_format(row['flops'], 'gflop')} "
        f"| {_format(row['max_abs_diff'], 'diff')} | {row.get('load_1m', '')} | {message} |")
  lines += ["", "## Utilisation (formulas: textattn/benchmark/utilization.py)", "",
            ("| variant | L | kernel | attention TFLOP/s | % of peak | TB/s moved | % of bandwidth "
             "| core TB/s (formula) | % of bandwidth (formula) | model TFLOP/s | MFU % "
             "| peak TFLOP/s |"),
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for row in rows:
    if row["status"] == "ok":
      lines.append(f"| {row['variant']} | {row['seq_len']} | {row.get('kernel', '')} | "
                   + " | ".join(_number_text(row.get(k)) for k in (
                       "attention_tflops", "pct_of_peak", "achieved_tbps", "pct_of_bandwidth",
                       "core_tbps", "pct_core_bandwidth", "model_tflops", "mfu_pct",
                       "peak_tflops")) + " |")
  lines += _mesh_lines(rows)
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def comm_ratio(row: dict) -> str:
  """HLO bytes / formula bytes of one layer, or "-" where there is no formula."""
  measured, expected = _number(row.get("comm_layer_bytes")), _number(row.get("comm_formula_bytes"))
  return f"{measured / expected:.3f}" if measured is not None and expected else "-"


def _mesh_lines(rows: Sequence[dict]) -> list[str]:
  """The --mesh section: memory per device, time, communication and load balance per point."""
  rows = [row for row in rows if row.get("mesh")]
  if not rows:
    return []
  cpu = str(rows[0].get("platform", "")).startswith("cpu")
  lines = ["", "## Sequence parallelism (--mesh = data x sequence)", "",
           "peak: per device (" + ("compiled memory_analysis" if cpu else "memory_stats") + "). "
           + ("Step time: the mesh's devices are fake CPU devices sharing this machine's cores, "
              "so it says nothing about the speed of that many real devices. " if cpu else "")
           + "Comm per layer: collective operand bytes per device of one attention layer's "
           "forward + backward at the point's sizes, read from its compiled HLO, against the "
           "formula stated in textattn/benchmark/collectives.py (float32); step: the timed "
           "program's collectives (every layer, the parameter gradients, the loss). Ring blocks: "
           "chunk-blocks each device of the sequence axis computes (forward; the backward "
           "follows the same schedule).", "",
           ("| variant | L | mesh | status | peak MiB per device | median ms | comm per layer "
            "(HLO) | comm per layer (formula) | HLO/formula | step collectives | ring blocks |"),
           "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
  def count(row, key):
    value = _number(row.get(key))
    return "-" if value is None else f"{value:,.0f}"

  for row in rows:
    lines.append(f"| {row['variant']} | {row['seq_len']} | {row['mesh']} | {row['status']} "
                 f"| {_format(row.get('peak_bytes'), 'mib')} "
                 f"| {_format(row.get('median_ms'), 'ms')} | {count(row, 'comm_layer_bytes')} "
                 f"| {count(row, 'comm_formula_bytes')} | {comm_ratio(row)} "
                 f"| {count(row, 'comm_step_bytes')} | {row.get('ring_blocks') or '-'} |")
  return lines


def _number_text(value) -> str:
  number = _number(value)
  return "-" if number is None else f"{number:.3g}"


def write_plots(rows: Sequence[dict], out_dir: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker
  from matplotlib import transforms

  mode = rows[0]["mode"] if rows else ""
  lengths = sorted({int(row["seq_len"]) for row in rows})
  for key, scale, ylabel, name in (
      ("median_ms", 1.0, "median step time (ms)", "time_vs_length.png"),
      ("peak_bytes", 2.0**-20, "peak memory (MiB)", "memory_vs_length.png")):
    figure, axes = plt.subplots(figsize=(6.4, 4.8))
    on_x_axis = transforms.blended_transform_factory(axes.transData, axes.transAxes)
    measured = False
    for index, variant in enumerate(dict.fromkeys(row["variant"] for row in rows)):
      ok = sorted((int(row["seq_len"]), _number(row[key]) * scale) for row in rows
                  if row["variant"] == variant and row["status"] == "ok"
                  and _number(row[key]) is not None)
      color = axes.plot(*zip(*ok), marker="o", label=variant)[0].get_color() if ok else None
      measured = measured or bool(ok)
      failed = [row for row in rows if row["variant"] == variant and row["status"] != "ok"]
      if failed:  # crosses along the bottom edge, one height per variant
        color = axes.plot([int(row["seq_len"]) for row in failed],
                          [0.03 + 0.03 * index] * len(failed), linestyle="none", marker="x",
                          markersize=8, color=color, transform=on_x_axis, clip_on=False,
                          label=None if ok else f"{variant} (failed)")[0].get_color()
      footprints = [(int(row["seq_len"]), _number(row[key]) * scale) for row in failed
                    if key == "peak_bytes" and _number(row[key]) is not None]
      if footprints:  # what a point that did not run (to the end) would have needed
        axes.plot(*zip(*footprints), linestyle="none", marker="o", markerfacecolor="none",
                  color=color)
        measured = True
    axes.set_xscale("log", base=2)
    if measured:
      axes.set_yscale("log")
    else:
      axes.text(0.5, 0.5, "no point succeeded", transform=axes.transAxes, ha="center")
    if lengths:
      axes.set_xticks(lengths, [str(length) for length in lengths])
      axes.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    note = "x at the bottom: oom / timeout / error" + (
        "; hollow: compiled footprint of such a point" if key == "peak_bytes" else "")
    axes.set_xlabel("sequence length")
    axes.set_ylabel(ylabel)
    axes.set_title(f"{mode}: {ylabel}\n{note}", fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    if axes.lines:
      axes.legend()
    figure.tight_layout()
    figure.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(figure)
