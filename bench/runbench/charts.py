"""The report's charts: gnuplot where installed, else an SVG of our own."""

import math
import os
import shutil
import subprocess

from .common import fmt


# ---- charts ----------------------------------------------------------------

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


def short_label(c):
    """A config label short enough for a chart's x axis."""
    c = c.replace(" KiB, every page", "K all").replace(" KiB, no page", "K none")
    c = c.replace(" KiB, one page", "K one").replace("x2 from 1 KiB to 64 MiB", "x2 to 64M")
    return c.replace("+4 KiB from 4 KiB to 8 MiB", "+4K to 8M").replace("=", "")


def chart(path, title, configs, names, panels):
    """panels: [(ylabel, log, {(config, name): value})]; gnuplot, else own SVG."""
    if shutil.which("gnuplot") and gnuplot_chart(path, title, configs, names, panels):
        return "gnuplot"
    svg_chart(path, title, configs, names, panels)
    return "svg"


def gnuplot_chart(path, title, configs, names, panels):
    base = os.path.splitext(path)[0]
    width = max(1000, 90 + len(configs) * (len(names) * 9 + 30))
    script = [
        f"set terminal svg size {width},{360 * len(panels) + 60} dynamic noenhanced "
        "font 'sans,11' background rgb 'white'",
        f"set output '{path}'",
        "set datafile missing '?'",
        "set style data histograms",
        "set style histogram clustered gap 1",
        "set style fill solid 0.85 border -1",
        "set key outside right top vertical",
        "set grid ytics",
        "set xtics nomirror scale 0",
        "set bmargin 3",
        f"set multiplot layout {len(panels)},1 title '{title}'",
    ]
    for k, (ylabel, log, data) in enumerate(panels):
        dat = f"{base}.{k}.dat"
        with open(dat, "w") as f:
            f.write("config " + " ".join(f'"{n}"' for n in names) + "\n")
            for c in configs:
                vals = []
                for n in names:
                    v = data.get((c, n))
                    if v is None or (log and v <= 0 and not ylabel.startswith("faults")):
                        vals.append("?")
                    elif log and v <= 0:
                        vals.append("0.01")  # zero faults drawn at the floor
                    else:
                        vals.append(f"{v:.6g}")
                f.write(f'"{short_label(c)}" ' + " ".join(vals) + "\n")
        script.append("set logscale y" if log else "unset logscale y")
        script.append(f"set ylabel '{ylabel}'")
        script.append("set yrange [0.01:*]" if log and ylabel.startswith("faults")
                      else "set yrange [*:*]" if log else "set yrange [0:*]")
        cols = ", ".join(
            (f"'{dat}' using {i + 2}:xtic(1) title columnheader" if i == 0 else
             f"'' using {i + 2} title columnheader") + f" lc rgb '{PALETTE[i % len(PALETTE)]}'"
            for i in range(len(names)))
        script.append("plot " + cols)
    script.append("unset multiplot")
    try:
        p = subprocess.run(["gnuplot"], input="\n".join(script) + "\n", capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return p.returncode == 0 and os.path.exists(path) and os.path.getsize(path) > 0


def svg_chart(path, title, configs, names, panels):
    """A plain grouped bar chart, one panel per metric (when gnuplot is missing)."""
    bar, gap, left, ph = 8, 24, 80, 300
    width = left + len(configs) * (len(names) * bar + gap) + 180
    height = 50 + len(panels) * (ph + 90)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for k, (ylabel, log, data) in enumerate(panels):
        top = 40 + k * (ph + 90)
        vals = [v for v in data.values() if v is not None and (v > 0 or not log)]
        hi = max(vals) if vals else 1
        lo = min(v for v in vals if v > 0) if log and vals else 0
        lo = 10 ** math.floor(math.log10(lo)) if log and lo else 0.01 if log else 0

        def y(v):
            if log:
                v = max(v, lo)
                f = (math.log10(v) - math.log10(lo)) / max(1e-9, math.log10(hi) - math.log10(lo))
            else:
                f = v / hi if hi else 0
            return top + ph - f * ph

        out.append(f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
                   f'text-anchor="middle">{ylabel}{" (log)" if log else ""}</text>')
        out.append(f'<line x1="{left}" y1="{top + ph}" x2="{width - 170}" y2="{top + ph}" '
                   'stroke="black"/>')
        ticks = ([10 ** e for e in range(int(math.floor(math.log10(lo))),
                                         int(math.ceil(math.log10(hi))) + 1) if 10 ** e <= hi]
                 if log else [hi * k / 4 for k in range(5)])
        for t in ticks:
            out.append(f'<text x="{left - 4}" y="{y(t) + 4}" text-anchor="end">{fmt(t)}</text>'
                       f'<line x1="{left}" y1="{y(t):.1f}" x2="{width - 170}" y2="{y(t):.1f}" '
                       'stroke="#ddd"/>')
        for ci, c in enumerate(configs):
            x0 = left + ci * (len(names) * bar + gap) + gap / 2
            for ni, n in enumerate(names):
                v = data.get((c, n))
                if v is None:
                    continue
                yy = y(v)
                out.append(f'<rect x="{x0 + ni * bar}" y="{yy:.1f}" width="{bar - 1}" '
                           f'height="{top + ph - yy:.1f}" fill="{PALETTE[ni % len(PALETTE)]}">'
                           f'<title>{n} {c}: {fmt(v)}</title></rect>')
            out.append(f'<text x="{x0}" y="{top + ph + 14}" font-size="9">'
                       f'{short_label(c)}</text>')
        for ni, n in enumerate(names):
            out.append(f'<rect x="{width - 160}" y="{top + ni * 15}" width="10" height="10" '
                       f'fill="{PALETTE[ni % len(PALETTE)]}"/><text x="{width - 145}" '
                       f'y="{top + ni * 15 + 9}">{n}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
