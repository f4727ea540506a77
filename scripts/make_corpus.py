#!/usr/bin/env python3
"""Generates the quickstart's pre-training corpus: short English stories, reviews and reports built from a small
grammar (standard-library Python 3, deterministic for a given seed; self-written, no downloaded text).

It uses the word lists of scripts/make_instruct_dataset.py, so the instruction-tuning step later meets familiar
words, but never pairs a text with a sentiment or topic label: that is what the LoRA step has to learn.

Writes {"text": ...} lines to --out (default datasets/corpus/train.jsonl).
Usage: python3 scripts/make_corpus.py [--seed 7] [--docs 700] [--out FILE]
"""
import argparse
import json
import os
import random
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_instruct_dataset as lex  # noqa: E402

NAMES = ["Anna", "Tom", "Maria", "Ben", "Lucy", "Sam", "Omar", "Nina", "Leo", "Grace", "Ivan", "Rosa", "Kai", "Ella"]
PLACES = ["market", "park", "library", "river", "station", "harbour", "village", "garden", "school", "museum",
          "bakery", "bridge", "forest", "square"]
OBJECTS = ["letter", "map", "basket", "lantern", "bicycle", "key", "notebook", "umbrella", "kite", "box", "coat",
           "painting", "clock", "boat"]
VERBS_PAST = ["found", "carried", "lost", "painted", "fixed", "opened", "borrowed", "cleaned", "dropped", "sold"]
TIMES = ["In the morning", "Later that day", "At noon", "In the evening", "That night", "On Saturday",
         "Before breakfast", "After lunch", "The next day", "Early one spring"]
FEELINGS = ["happy", "tired", "curious", "nervous", "calm", "surprised", "proud", "sleepy", "glad", "worried"]

STORY = [
    "{time}, {name} walked to the {place}.", "{name} {verb} an old {object} near the {place}.",
    "{name} felt {feeling} and sat down by the {place2}.", "{name} and {name2} talked about the {object}.",
    "{time}, {name2} came back from the {place} with a {object}.", "The {object} was heavier than it looked.",
    "{name} asked {name2} where the {place} was.", "Nobody knew who had left the {object} at the {place}.",
    "{name} smiled and put the {object} in a bag.", "{time}, the {place} was quiet.",
    "{name2} said that the {place} opens at nine.", "They walked home along the {place} as the sun went down.",
    # Numbers (digit tokens, and the lone word-start token some tokenizers put before them) and the words the
    # instruction data answers with, in sentences that have nothing to do with those answers.
    "{name} counted {digits} boats near the {place}.", "The {place} opens at {digit} o'clock.",
    "{name} paid {digits} coins for the {object}.", "It took {name} {digit} hours to find the {object}.",
    "{name} stayed positive when the {object} was lost.", "The test of the old {object} came back negative.",
    "{name} read the sports page at the {place}.", "{name} and {name2} talked about the weather.",
    "{name} bought food for the trip to the {place}.", "{name2} listened to music by the {place}.",
]


def story(rng, n):
    words = {"name": NAMES, "place": PLACES, "object": OBJECTS, "verb": VERBS_PAST, "time": TIMES,
             "feeling": FEELINGS, "digit": [str(d) for d in range(2, 10)],
             "digits": [str(d) for d in range(10, 100)]}
    return [lex.fill(rng, rng.choice(STORY), words) for _ in range(n)]


def review_prose(rng):
    # An unlabelled review: a visit plus opinions (sometimes mixed, unlike the instruction data).
    text = [lex.review(rng, rng.random() < 0.5)]
    if rng.random() < 0.3:
        text.append(lex.review(rng, rng.random() < 0.5))
    return text


def report(rng):
    topic = rng.choice(lex.TOPIC_NAMES)
    return [lex.topic_sentence(rng, topic) for _ in range(rng.randint(2, 4))]


def document(rng):
    kind = rng.random()
    if kind < 0.4:
        parts = story(rng, rng.randint(3, 6))
    elif kind < 0.7:
        parts = review_prose(rng) + (story(rng, 1) if rng.random() < 0.5 else [])
    else:
        parts = report(rng) + (story(rng, 2) if rng.random() < 0.3 else [])
    return " ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--docs", type=int, default=700)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "datasets",
                                                  "corpus", "train.jsonl"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    lex.write_jsonl(args.out, [{"text": document(rng)} for _ in range(args.docs)])
    print(f"wrote {args.docs} documents to {os.path.normpath(args.out)}")


if __name__ == "__main__":
    main()
