"""Regenerate the shipped image tasks: ``images/*.png`` and ``tasks.jsonl`` in this folder.

Four categories of small (320x240) images made by this project, never downloaded: ``document`` (invoices,
receipts, memos with printed fields), ``table`` (small numeric tables), ``chart`` (bar and line charts
with titles, labels and values) and ``scene`` (simple coloured shapes). Every image comes with
*grounded* questions, whose short answer is printed or countable in the image (``reference`` holds it,
computed from the same values the image was drawn from), and one *descriptive* question.

Deterministic: one ``numpy`` generator seeded from ``--seed`` (default 2026) draws all contents; the
figures use matplotlib's bundled DejaVu font, the Agg backend and no PNG metadata, and are stored as
64-colour palette PNGs. Same seed and same matplotlib version -> byte-identical files.

    python data/vlm_tasks/make_images.py            # rewrite images/ and tasks.jsonl here
    python data/vlm_tasks/make_images.py --out DIR  # somewhere else
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np

WIDTH, HEIGHT, DPI = 320, 240, 100
PER_CATEGORY = 6
DESCRIBE = {
    "document": "Describe this document.",
    "table": "Summarize what this table shows.",
    "chart": "Describe this chart and the trend it shows.",
    "scene": "Describe this picture in detail.",
}

ITEMS = ["Paper", "Pens", "Stapler", "Toner", "Folders", "Tape", "Labels", "Markers", "Envelopes", "Clips"]
SHOPS = ["Corner Market", "Blue Cafe", "Hill Bakery", "City Books", "Green Grocer", "Star Hardware"]
NAMES = ["Alice Moreau", "Ben Okafor", "Chen Wei", "Dana Levi", "Emil Novak", "Fatima Khan"]
CITIES = ["Arden", "Brook", "Calder", "Dunmore", "Elston", "Fairview", "Glenholm", "Harlow"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun"]
FRUITS = ["Apples", "Pears", "Plums", "Grapes", "Cherries", "Lemons"]
COLORS = {"red": "#d62728", "blue": "#1f77b4", "green": "#2ca02c", "orange": "#ff7f0e", "purple": "#9467bd"}


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.family": "DejaVu Sans", "font.size": 8, "svg.hashsalt": "entropy-law"})
    return plt.figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        image.save(path, format="PNG", optimize=True)


def _money(x: float) -> str:
    return f"${x:,.2f}"


def document(rng: np.random.Generator, index: int, path: Path) -> list[dict]:
    kind = ("invoice", "receipt", "memo")[index % 3]
    fig = _figure()
    fig.patch.set_facecolor("white")
    write = lambda y, s, **kw: fig.text(0.06, y, s, transform=fig.transFigure, **kw)  # noqa: E731
    if kind == "memo":
        sender, recipient = rng.choice(NAMES, size=2, replace=False)
        day, hour = int(rng.integers(1, 29)), int(rng.integers(9, 17))
        room = f"{rng.choice(list('ABC'))}{int(rng.integers(101, 420))}"
        write(0.88, "MEMO", fontsize=14, weight="bold")
        write(0.74, f"To: {recipient}")
        write(0.66, f"From: {sender}")
        write(0.58, f"Date: 2025-04-{day:02d}")
        write(0.44, f"The project review moves to room {room}")
        write(0.36, f"at {hour}:00. Please bring the draft report.")
        _save(fig, path)
        return [
            {"turns": ["Who wrote this memo?"], "kind": "grounded", "reference": str(sender)},
            {"turns": ["In which room is the project review?"], "kind": "grounded", "reference": room},
            {"turns": ["At what time is the review?"], "kind": "grounded", "reference": f"{hour}:00"},
        ]
    n_items = int(rng.integers(3, 5))
    names = rng.choice(ITEMS, size=n_items, replace=False)
    prices = np.round(rng.uniform(1.5, 60.0, size=n_items), 2)
    qty = rng.integers(1, 6, size=n_items)
    total = float(np.round((prices * qty).sum(), 2))
    number = int(rng.integers(1000, 9999))
    title = "INVOICE" if kind == "invoice" else str(rng.choice(SHOPS))
    write(0.88, title, fontsize=13, weight="bold")
    write(0.79, f"{'Invoice' if kind == 'invoice' else 'Receipt'} No. {number}    Date: 2025-0{index % 9 + 1}-1{index}")
    y = 0.68
    for name, q, p in zip(names, qty, prices):
        write(y, f"{name:<10} {q} x {_money(p)}", family="DejaVu Sans Mono")
        y -= 0.09
    write(y - 0.04, f"TOTAL  {_money(total)}", weight="bold", fontsize=10)
    _save(fig, path)
    label = "invoice" if kind == "invoice" else "receipt"
    return [
        {"turns": [f"What is the total amount on this {label}?"], "kind": "grounded", "reference": _money(total)},
        {"turns": [f"What is the {label} number?"], "kind": "grounded", "reference": str(number)},
        {"turns": [f"How many units of {names[0].lower()} were bought?"], "kind": "grounded",
         "reference": str(int(qty[0]))},
    ]


def table(rng: np.random.Generator, index: int, path: Path) -> list[dict]:
    cities = list(rng.choice(CITIES, size=4, replace=False))
    population = rng.integers(12, 950, size=4) * 100
    area = np.round(rng.uniform(5, 90, size=4), 1)
    fig = _figure()
    ax = fig.add_axes([0.03, 0.05, 0.94, 0.8])
    ax.axis("off")
    fig.text(0.5, 0.9, f"Town statistics {2015 + index}", ha="center", fontsize=11, weight="bold")
    cells = [[c, f"{p:,}", f"{a}"] for c, p, a in zip(cities, population, area)]
    tab = ax.table(cellText=cells, colLabels=["Town", "Population", "Area (km2)"], loc="center", cellLoc="center")
    tab.scale(1, 1.6)
    _save(fig, path)
    largest = cities[int(np.argmax(population))]
    return [
        {"turns": [f"What is the population of {cities[1]}?"], "kind": "grounded", "reference": f"{population[1]:,}"},
        {"turns": ["Which town has the largest population?"], "kind": "grounded", "reference": largest},
        {"turns": [f"What is the area of {cities[2]} in square kilometres?"], "kind": "grounded",
         "reference": f"{area[2]}"},
    ]


def chart(rng: np.random.Generator, index: int, path: Path) -> list[dict]:
    fig = _figure()
    ax = fig.add_axes([0.17, 0.16, 0.78, 0.68])
    if index % 2 == 0:
        labels = list(rng.choice(FRUITS, size=4, replace=False))
        values = rng.integers(10, 95, size=4)
        title = f"Fruit sold in week {index + 1}"
        bars = ax.bar(labels, values, color="#1f77b4")
        ax.bar_label(bars, labels=[str(v) for v in values])
        ax.set_ylim(0, 110)
        ax.set_ylabel("boxes")
        top = labels[int(np.argmax(values))]
        questions = [
            {"turns": ["What is the title of the chart?"], "kind": "grounded", "reference": title},
            {"turns": [f"How many boxes of {labels[0].lower()} were sold?"], "kind": "grounded",
             "reference": str(int(values[0]))},
            {"turns": ["Which fruit sold the most?"], "kind": "grounded", "reference": top},
        ]
    else:
        values = np.round(np.cumsum(rng.uniform(-3, 6, size=6)) + 20, 1)
        title = f"Average temperature {2019 + index}"
        ax.plot(MONTHS, values, marker="o", color="#d62728")
        for m, v in zip(MONTHS, values):
            ax.annotate(f"{v}", (m, v), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7)
        ax.set_ylabel("deg C")
        ax.set_ylim(values.min() - 4, values.max() + 5)
        warmest = MONTHS[int(np.argmax(values))]
        questions = [
            {"turns": ["What is the title of the chart?"], "kind": "grounded", "reference": title},
            {"turns": ["What was the temperature in March?"], "kind": "grounded", "reference": f"{values[2]}"},
            {"turns": ["Which month was the warmest?"], "kind": "grounded", "reference": warmest},
        ]
    ax.set_title(title, fontsize=10)
    _save(fig, path)
    return questions


def scene(rng: np.random.Generator, index: int, path: Path) -> list[dict]:
    from matplotlib import patches

    fig = _figure()
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(0, HEIGHT)
    ax.axis("off")
    ax.add_patch(patches.Rectangle((0, 0), WIDTH, 70, color="#8fbc5a"))  # grass
    ax.add_patch(patches.Rectangle((0, 70), WIDTH, HEIGHT - 70, color="#cfe8ff"))  # sky
    circle_color, square_color = rng.choice(list(COLORS), size=2, replace=False)
    n_circles = int(rng.integers(1, 6))
    xs = np.linspace(30, 290, n_circles + 2)[1:-1]
    for x in xs:
        ax.add_patch(patches.Circle((x, 40), 13, color=COLORS[circle_color]))
    ax.add_patch(patches.Rectangle((120, 100), 70, 60, color=COLORS[square_color]))
    has_sun = bool(index % 2 == 0)
    if has_sun:
        ax.add_patch(patches.Circle((270, 200), 22, color="#ffd400"))
    word = str(rng.choice(["HELLO", "OPEN", "STOP", "EXIT", "CAFE", "PARK"]))
    ax.text(155, 130, word, ha="center", va="center", color="white", fontsize=11, weight="bold")
    _save(fig, path)
    return [
        {"turns": [f"How many {circle_color} circles are there?"], "kind": "grounded", "reference": str(n_circles)},
        {"turns": ["What word is written on the square?"], "kind": "grounded", "reference": word},
        {"turns": ["What colour is the square?"], "kind": "grounded", "reference": str(square_color)},
        {"turns": ["Is there a sun in the sky? Answer yes or no."], "kind": "grounded",
         "reference": "yes" if has_sun else "no"},
    ]


MAKERS = {"document": document, "table": table, "chart": chart, "scene": scene}


def make(out: Path, seed: int = 2026) -> list[dict]:
    """Write the images and ``tasks.jsonl`` under ``out``; return the task records."""
    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for category, maker in MAKERS.items():
        for index in range(PER_CATEGORY):
            name = f"{category}-{index + 1:02d}"
            image = Path("images") / f"{name}.png"
            questions = maker(rng, index, out / image) + [
                {"turns": [DESCRIBE[category]], "kind": "descriptive"}]
            for q_index, question in enumerate(questions, start=1):
                records.append({"question_id": f"{name}-q{q_index}", "category": category, "image": image.as_posix(),
                                **question})
    with (out / "tasks.jsonl").open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="folder for images/ and tasks.jsonl (default: this script's folder)")
    parser.add_argument("--seed", type=int, default=2026, help="seed of all drawn contents (default: %(default)s)")
    args = parser.parse_args(argv)
    records = make(args.out, args.seed)
    print(f"wrote {len(records)} tasks and {len(MAKERS) * PER_CATEGORY} images to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
