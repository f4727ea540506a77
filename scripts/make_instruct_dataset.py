#!/usr/bin/env python3
"""Generates the quickstart's instruction dataset (standard-library Python 3, deterministic for a given seed).

Two short-answer tasks a tiny model can learn with a few hundred LoRA steps on a CPU, both decided by which
words a sentence contains (so a model that has only read English prose gets them wrong, and one that attends to
the right words gets them right):

  sentiment:  "Review: The soup was cold and the waiter was rude.\nIs this review positive or negative?\nAnswer:"
              -> " negative"
  topic:      "Sentence: The striker scored a late goal.\nWhich topic is this: sports, food, weather or music?\nAnswer:"
              -> " sports"

The sentences are built from the same word lists as the pre-training corpus (scripts/make_corpus.py), so the words
are familiar, but the corpus never pairs a sentence with a label. The validation split uses its own random stream
and holds no prompt that is also in the training split.

Writes, under --out (default datasets/instruct):
  train.jsonl, valid.jsonl            {"prompt": ..., "completion": ...}   (lmtune data.format: completion)
  chat/train.jsonl, chat/valid.jsonl  {"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}

Usage: python3 scripts/make_instruct_dataset.py [--seed 1234] [--train 2000] [--valid 200] [--out DIR]
"""
import argparse
import json
import os
import random

# ---- word lists (shared with scripts/make_corpus.py) ---------------------------------------------------------

POSITIVE = ["great", "wonderful", "excellent", "delicious", "friendly", "lovely", "perfect", "amazing", "fresh",
            "comfortable", "beautiful", "brilliant", "pleasant", "superb", "charming", "cheerful", "fantastic",
            "helpful", "clean", "cozy", "warm", "tasty", "quiet", "generous"]
NEGATIVE = ["terrible", "awful", "rude", "cold", "boring", "dirty", "bland", "slow", "broken", "noisy",
            "disappointing", "horrible", "stale", "dull", "poor", "ugly", "cramped", "greasy", "unpleasant",
            "useless", "soggy", "rusty", "careless", "overpriced"]
INTENSIFIERS = ["", "", "", "very ", "really ", "quite ", "truly ", "so "]

# Things a review talks about: (place or product, aspects of it).
REVIEW_SUBJECTS = [
    ("restaurant", ["soup", "bread", "service", "waiter", "pasta", "dessert", "table", "coffee", "menu", "salad"]),
    ("hotel", ["room", "bed", "staff", "breakfast", "shower", "view", "lobby", "pool", "carpet", "receptionist"]),
    ("film", ["story", "acting", "music", "ending", "hero", "dialogue", "camera work", "villain", "plot", "cast"]),
    ("phone", ["screen", "battery", "camera", "case", "charger", "speaker", "keyboard", "box", "manual", "app"]),
    ("cafe", ["tea", "cake", "coffee", "music", "chairs", "barista", "cookies", "window seat", "muffin", "toast"]),
    ("train trip", ["seat", "carriage", "conductor", "journey", "snack trolley", "station", "ticket desk",
                    "window", "platform", "timetable"]),
]
REVIEW_NEUTRAL = [
    "We went there on a {day}.", "I visited with my {relative} last {day}.", "It was my {nth} visit.",
    "We stayed for {num} hours.", "I bought it {when}.", "My {relative} recommended the {subject}.",
    "We booked the {subject} online.", "I tried the {subject} {when}.",
]
REVIEW_POLAR = [
    "The {aspect} was {int}{adj}.", "I found the {aspect} {int}{adj}.", "Honestly, the {aspect} felt {int}{adj}.",
    "The {aspect} and the {aspect2} were {int}{adj}.", "Everything about the {aspect} was {adj}.",
    "What a {adj} {aspect}!", "The {aspect} seemed {int}{adj} to me.", "Our {aspect} was {int}{adj}.",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
RELATIVES = ["sister", "brother", "mother", "father", "friend", "cousin", "aunt", "uncle", "neighbour", "partner"]
NTH = ["first", "second", "third", "fourth", "fifth"]
WHEN = ["last week", "yesterday", "in the spring", "a month ago", "on holiday", "after work", "in the summer"]

# Topic sentences: each topic has templates and the words that fill them.
TOPICS = {
    "sports": {
        "templates": [
            "The {team} scored a late goal in the {event}.", "Our {player} ran faster than anyone in the {event}.",
            "The {team} trained hard before the {event}.", "The referee stopped the {event} after a foul.",
            "The coach picked a new {player} for the {event}.", "The crowd cheered when the {team} won the {event}.",
            "She kicked the ball past the goalkeeper in the {event}.", "The {player} lifted the trophy after the {event}.",
        ],
        "team": ["home team", "young team", "visiting side", "school team", "national team", "local club"],
        "player": ["striker", "goalkeeper", "runner", "captain", "defender", "swimmer", "tennis player"],
        "event": ["match", "final", "race", "season", "tournament", "league game", "relay"],
    },
    "food": {
        "templates": [
            "The {cook} added {ingredient} to the {dish}.", "Slice the {ingredient} and put it in the {dish}.",
            "The {dish} needs to bake in the oven for an hour.", "The {cook} tasted the {dish} and added salt.",
            "We chopped {ingredient} for the {dish}.", "The kitchen smelled of {ingredient} and fresh {dish}.",
            "Stir the {dish} slowly and add a little {ingredient}.", "The {cook} served the {dish} with {ingredient}.",
        ],
        "cook": ["chef", "baker", "cook", "grandmother", "waiter"],
        "ingredient": ["garlic", "onion", "butter", "pepper", "lemon", "cheese", "rice", "carrots", "honey", "flour"],
        "dish": ["soup", "bread", "stew", "pie", "salad", "curry", "pasta", "cake", "omelette"],
    },
    "weather": {
        "templates": [
            "Heavy {precip} is expected in the {area} tonight.", "The forecast says {sky} skies for the {area}.",
            "A strong {wind} blew across the {area}.", "The temperature will drop below zero in the {area}.",
            "After the {precip}, the {area} was covered in puddles.", "Thick fog rolled over the {area} at dawn.",
            "It will be {sky} and windy in the {area} tomorrow.", "A storm with {precip} and thunder hit the {area}.",
        ],
        "precip": ["rain", "snow", "hail", "sleet", "drizzle"],
        "sky": ["cloudy", "sunny", "grey", "clear", "stormy"],
        "wind": ["wind", "gale", "breeze", "gust"],
        "area": ["north", "coast", "valley", "mountains", "city", "islands", "south", "hills"],
    },
    "music": {
        "templates": [
            "The {musician} played a slow {piece} on the {instrument}.", "The band recorded a new {piece} last night.",
            "She tuned her {instrument} before the concert.", "The {musician} sang the {piece} in a soft voice.",
            "The drummer kept the rhythm while the {musician} played the {instrument}.",
            "Their new album has a {piece} for {instrument} and voice.", "The choir practised the {piece} twice.",
            "He learned the {piece} on the {instrument} by ear.",
        ],
        "musician": ["singer", "pianist", "guitarist", "violinist", "band leader", "composer"],
        "instrument": ["piano", "guitar", "violin", "drums", "flute", "cello", "trumpet"],
        "piece": ["song", "melody", "tune", "ballad", "symphony", "chorus", "lullaby"],
    },
}
TOPIC_NAMES = list(TOPICS)

SENTIMENT_QUESTION = "Is this review positive or negative?"
TOPIC_QUESTION = "Which topic is this: sports, food, weather or music?"


def fill(rng, template, words):
    """Fills {slot}s in template from words (slot -> list); a slot named like another plus '2' picks a different
    word from the same list."""
    out, chosen = template, {}
    for slot in sorted(words, key=len, reverse=True):
        for name in (slot + "2", slot):
            key = "{" + name + "}"
            while key in out:
                choices = [w for w in words[slot] if w not in chosen.values()] or words[slot]
                chosen[name] = rng.choice(choices)
                out = out.replace(key, chosen[name], 1)
    return out


def review(rng, positive):
    subject, aspects = rng.choice(REVIEW_SUBJECTS)
    words = {"aspect": aspects, "adj": POSITIVE if positive else NEGATIVE, "int": INTENSIFIERS,
             "day": DAYS, "relative": RELATIVES, "nth": NTH, "when": WHEN, "subject": [subject],
             "num": ["two", "three", "four"]}
    parts = []
    if rng.random() < 0.6:
        parts.append(fill(rng, rng.choice(REVIEW_NEUTRAL), words))
    for _ in range(rng.choice([1, 1, 2])):
        parts.append(fill(rng, rng.choice(REVIEW_POLAR), words))
    rng.shuffle(parts)
    text = " ".join(parts)
    return text[0].upper() + text[1:]


def topic_sentence(rng, topic):
    spec = TOPICS[topic]
    words = {k: v for k, v in spec.items() if k != "templates"}
    return fill(rng, rng.choice(spec["templates"]), words)


def example(rng):
    if rng.random() < 0.5:
        positive = rng.random() < 0.5
        prompt = f"Review: {review(rng, positive)}\n{SENTIMENT_QUESTION}\nAnswer:"
        return prompt, "positive" if positive else "negative"
    topic = rng.choice(TOPIC_NAMES)
    return f"Sentence: {topic_sentence(rng, topic)}\n{TOPIC_QUESTION}\nAnswer:", topic


def split(rng, n, exclude):
    out, seen = [], set(exclude)
    while len(out) < n:
        prompt, answer = example(rng)
        if prompt in seen:
            continue
        seen.add(prompt)
        out.append((prompt, answer))
    return out


def write_jsonl(path, records):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--valid", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "datasets",
                                                  "instruct"))
    args = ap.parse_args()
    train = split(random.Random(args.seed), args.train, ())
    valid = split(random.Random(args.seed + 1), args.valid, (p for p, _ in train))
    for name, rows in (("train", train), ("valid", valid)):
        write_jsonl(os.path.join(args.out, f"{name}.jsonl"),
                    [{"prompt": p, "completion": " " + a} for p, a in rows])
        # Chat variant: the question without the "Answer:" cue; the reply is the bare label.
        write_jsonl(os.path.join(args.out, "chat", f"{name}.jsonl"),
                    [{"messages": [{"role": "user", "content": p[: -len("\nAnswer:")]},
                                   {"role": "assistant", "content": a}]} for p, a in rows])
    print(f"wrote {len(train)} train / {len(valid)} valid examples to {os.path.normpath(args.out)}")


if __name__ == "__main__":
    main()
