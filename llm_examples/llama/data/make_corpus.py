"""Generate ``corpus.txt``: short English stories written from templates for this project (no third-party text).

Each document is a small story of 4-9 sentences about a few characters, objects and places; documents are
separated by one blank line (the format ``scripts/build_pretrain_data.py`` reads by default). Within a
story the same names and objects recur, so a tiny causal LM can lower its loss by learning to copy
entities from context as well as the grammar of the templates.

Run:  python llm_examples/llama/data/make_corpus.py [--num_docs 800] [--seed 1234]
"""
import argparse
import random
from pathlib import Path

NAMES = ["Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Henry", "Iris", "Jack", "Lena", "Max",
         "Nora", "Oscar", "Paula", "Sam", "Tara", "Victor", "Wendy", "Zoe"]
OBJECTS = ["ball", "book", "kite", "lamp", "box", "cup", "hat", "map", "key", "boat", "drum", "clock"]
COLORS = ["red", "blue", "green", "yellow", "small", "old", "new", "shiny", "wooden", "heavy"]
PLACES = ["the park", "the garden", "the kitchen", "the library", "the beach", "the market", "the school",
          "the forest", "the station", "the river"]
TIMES = ["In the morning", "After lunch", "In the evening", "On Sunday", "One rainy day", "Later that day"]
FEELINGS = ["happy", "tired", "surprised", "curious", "proud", "worried", "calm"]
WEATHER = ["The sun was bright.", "It was cold and windy.", "Rain fell all day.", "The sky was grey.",
           "It was a warm day."]


def story(rng: random.Random) -> str:
    """One document: an opening, a few linked events with the same cast, and a closing line."""
    a, b = rng.sample(NAMES, 2)
    obj, color, place = rng.choice(OBJECTS), rng.choice(COLORS), rng.choice(PLACES)
    lines = [f"{rng.choice(TIMES)}, {a} went to {place}.", rng.choice(WEATHER)]
    events = [
        f"{a} found a {color} {obj} near the gate.",
        f"{a} showed the {obj} to {b}.",
        f"{b} said, \"I like your {color} {obj}.\"",
        f"{a} and {b} carried the {obj} to {rng.choice(PLACES)}.",
        f"{b} asked {a} where the {obj} came from.",
        f"{a} told {b} that the {obj} was found in {place}.",
        f"The {obj} was {rng.choice(['heavier', 'lighter', 'older', 'bigger'])} than it looked.",
        f"{b} felt {rng.choice(FEELINGS)} and smiled at {a}.",
        f"They counted {rng.randint(2, 9)} birds on the way home.",
    ]
    # Keep the first event (it introduces the object), then a random ordered subset of the rest.
    k = rng.randint(2, len(events) - 1)
    chosen = [events[0]] + sorted(rng.sample(events[1:], k), key=events.index)
    lines += chosen
    lines.append(f"At the end of the day, {a} was {rng.choice(FEELINGS)} and put the {obj} in a safe place.")
    # Wrap the story over two or three lines so documents are multi-line paragraphs.
    cut = sorted(rng.sample(range(1, len(lines)), 2))
    return "\n".join(" ".join(part) for part in (lines[: cut[0]], lines[cut[0]: cut[1]], lines[cut[1]:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_docs", type=int, default=800)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--output", default=str(Path(__file__).parent / "corpus.txt"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    text = "\n\n".join(story(rng) for _ in range(args.num_docs)) + "\n"
    Path(args.output).write_text(text, encoding="utf-8")
    print(f"wrote {args.num_docs} documents, {len(text)} characters to {args.output}")


if __name__ == "__main__":
    main()
