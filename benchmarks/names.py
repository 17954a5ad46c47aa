"""A seeded generator of realistic entity names, and the perturbations the benchmarks resolve.

Nothing is downloaded: people, methods, datasets, organisations and places are built from the word
and syllable lists below, so the same seed always yields the same names. `names()` yields
unique (display form, type, alias) records - unique by *key*, so a benchmark mention that should
converge never turns ambiguous by accident. `perturb` turns a stored name into a mention of a given
kind (case, punctuation, single typo that counts under SPEC section 2), and `new_name` makes names
no store built here contains (their syllables are never used by `names()`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from identity_server.normalize import display_form, key, one_edit_apart

FIRST_NAMES = (
    "Ada Alan Grace Edsger Barbara Donald John Margaret Claude Frances Tim Radia Leslie Ken Dennis "
    "Niklaus Robin Shafi Silvio Judea Yoshua Geoffrey Yann Fei Andrew Daphne Cynthia Shwetak "
    "Maria Carlos Sofia Lucas Mateo Valentina Camila Diego Elena Hugo Chloe Louis Emma Jules Lea "
    "Paul Anna Lukas Mia Felix Hannah Jonas Lena Noah Ida Oskar Freja Emil Astrid Viktor Ingrid "
    "Aarav Priya Rohan Ananya Vikram Kavya Arjun Meera Ravi Sita Wei Mei Jun Hui Lei Xin Yuki "
    "Haruto Sakura Ren Aoi Min-jun Seo-yeon Ji-ho Hye-jin Omar Layla Yusuf Amira Karim Nadia "
    "Tariq Zainab Kwame Amara Kofi Abena Chidi Ngozi Tendai Thandiwe Olga Ivan Dmitri Natalia "
    "Sergei Irina Pavel Katarzyna Piotr Agnieszka Jan Eva Tomas Petra Miklos Zsofia Andras "
    "Giulia Marco Francesca Luca Chiara Matteo Ines Joao Beatriz Tiago Nuno Ruth Samuel Esther "
    "David Rachel Daniel Sarah Michael Laura James Emily Robert Olivia William Sophie Thomas "
    "Charlotte George Alice Henry Isabel Edward Lucy Richard Helen Peter Clara Stefan Ulrike "
    "Bernd Katrin Jurgen Sabine Dieter Monika Pierre Camille Antoine Manon Nicolas Juliette"
).split()

LAST_NAMES = (
    "Lovelace Turing Hopper Dijkstra Liskov Knuth McCarthy Hamilton Shannon Allen Berners-Lee "
    "Perlman Lamport Thompson Ritchie Wirth Milner Goldwasser Micali Pearl Bengio Hinton LeCun "
    "Li Ng Koller Dwork Patel Garcia Rodriguez Martinez Lopez Gonzalez Perez Sanchez Ramirez "
    "Torres Flores Rivera Gomez Diaz Moreau Laurent Lefebvre Mercier Dubois Fontaine Girard "
    "Muller Schmidt Schneider Fischer Weber Meyer Wagner Becker Schulz Hoffmann Koch Richter "
    "Andersson Johansson Karlsson Nilsson Eriksson Larsson Olsen Hansen Jensen Nielsen Virtanen "
    "Sharma Gupta Singh Kumar Iyer Reddy Nair Mehta Chatterjee Banerjee Wang Zhang Liu Chen Yang "
    "Huang Zhao Wu Zhou Xu Sato Suzuki Takahashi Tanaka Watanabe Ito Yamamoto Nakamura Kim Lee "
    "Park Choi Jung Kang Haddad Khalil Nasser Farouk Mensah Okafor Adeyemi Mwangi Dlamini Nkosi "
    "Ivanov Petrov Sokolov Kuznetsov Popov Kowalski Nowak Wisniewski Novak Svoboda Horvath Nagy "
    "Rossi Russo Ferrari Esposito Bianchi Romano Silva Santos Ferreira Pereira Oliveira Costa "
    "Cohen Levi Mizrahi Smith Johnson Williams Brown Jones Miller Davis Wilson Anderson Taylor "
    "Thomas Moore Martin Jackson White Harris Clark Lewis Walker Young King Wright Scott Green"
).split()

# Syllables for coined surnames, method words, dataset and place names. NEW_SYLLABLES share no
# entry with SYLLABLES, so names made from them are absent from every generated store.
SYLLABLES = (
    "ka ri no ta mi se lo ve an dor bel cas den fal gar hol ish jor kel lan mar nor pel quin "
    "ros sal tor ul van wil yor zen bra cle dri fro gla pre sto tri ber gen hal mon rud sil"
).split()
NEW_SYLLABLES = "zyx kwo xu qoz vyk jyx wuq fyz oxq zuv".split()

METHOD_HEADS = (
    "Graph Attention Convolutional Recurrent Residual Sparse Dense Variational Contrastive "
    "Adversarial Bayesian Hierarchical Gated Spectral Temporal Causal Neural Probabilistic "
    "Stochastic Federated Differentiable Equivariant Implicit Latent Masked Diffusion Kernel "
    "Self-Supervised Multi-Scale Cross-Modal Low-Rank Mixture-of-Experts Quantized Distilled"
).split()
METHOD_TAILS = (
    "Network Transformer Autoencoder Encoder Decoder Model Regression Forest Machine Sampler "
    "Embedding Pooling Attention Flow Field Estimator Optimizer Descent Search Parser Tagger "
    "Classifier Segmenter Tokenizer Retriever Ranker Planner Policy Critic"
).split()
DATASET_TAILS = "Corpus Benchmark Treebank Dataset Collection Suite Challenge Atlas Archive".split()
DATASET_DOMAINS = (
    "Question Answering;Image Classification;Named Entity;Protein Folding;Speech;Sentiment;"
    "Machine Translation;Object Detection;Reading Comprehension;Medical Imaging;Code Search;"
    "Climate;Genome;Molecule;Traffic;Satellite Imagery;Dialogue;Summarization"
).split(";")
ORG_FORMS = (
    "University of {p};{p} Institute of Technology;{p} Research Laboratory;{s} Labs;"
    "{p} Polytechnic;{s} Foundation;Max {s} Institute;{p} Medical Center;{s} AI;"
    "{p} National Laboratory;{s} & {t} Associates;{p} Academy of Sciences"
).split(";")
PLACE_FORMS = "{p};Lake {p};Port {p};{p} Valley;Mount {p};{p} Springs;New {p};{p}burg".split(";")

TYPES = ("person", "method", "dataset", "organization", "place")
TYPE_WEIGHTS = (40, 20, 10, 15, 15)


@dataclass(frozen=True, slots=True)
class NameRecord:
    display: str
    entity_type: str
    alias: str | None


def _coined(rng: random.Random, syllables: list[str], lo: int = 2, hi: int = 3) -> str:
    return "".join(rng.choice(syllables) for _ in range(rng.randint(lo, hi))).capitalize()


def _acronym(words: str) -> str:
    return "".join(w[0] for w in words.replace("-", " ").split() if w[0].isalpha()).upper()


def _person(rng: random.Random, syl: list[str]) -> tuple[str, str | None]:
    first = rng.choice(FIRST_NAMES)
    last = rng.choice(LAST_NAMES) if rng.random() < 0.3 else _coined(rng, syl, 2, 3)
    if rng.random() < 0.25:
        last = f"{last}-{_coined(rng, syl, 2, 2)}"
    middle = f" {rng.choice('ABCDEFGHJKLMNPRSTW')}." if rng.random() < 0.2 else ""
    name = f"{first}{middle} {last}"
    alias = f"{last}, {first}" if rng.random() < 0.3 else None
    return name, alias


def _method(rng: random.Random, syl: list[str]) -> tuple[str, str | None]:
    r = rng.random()
    if r < 0.5:
        words = f"{rng.choice(METHOD_HEADS)} {_coined(rng, syl, 2, 3)} {rng.choice(METHOD_TAILS)}"
        alias = f"{_acronym(words)}-{_coined(rng, syl, 1, 2)}" if rng.random() < 0.3 else None
        return words, alias
    if r < 0.8:
        base = _coined(rng, syl, 2, 3) + rng.choice(("Net", "Former", "BERT", "GAN", "Flow"))
        return f"{base}-{rng.choice((18, 34, 50, 101, 152, 1, 2, 3, 7))}", None
    return f"{_coined(rng, syl, 2, 3)} {rng.choice(METHOD_TAILS)}", None


def _dataset(rng: random.Random, syl: list[str]) -> tuple[str, str | None]:
    if rng.random() < 0.5:
        return f"{_coined(rng, syl)}-{rng.choice(('1k', '10k', '2003', '2012', 'v2', 'XL'))}", None
    words = f"{_coined(rng, syl)} {rng.choice(DATASET_DOMAINS)} {rng.choice(DATASET_TAILS)}"
    alias = f"{_acronym(words)}-{_coined(rng, syl, 1, 2)}" if rng.random() < 0.4 else None
    return words, alias


def _organization(rng: random.Random, syl: list[str]) -> tuple[str, str | None]:
    form = rng.choice(ORG_FORMS)
    name = form.format(p=_coined(rng, syl, 2, 3), s=_coined(rng, syl, 2, 3),
                       t=_coined(rng, syl, 2, 3))
    alias = f"{_acronym(name)} {_coined(rng, syl, 1, 2)}" if rng.random() < 0.3 else None
    return name, alias


def _place(rng: random.Random, syl: list[str]) -> tuple[str, str | None]:
    return rng.choice(PLACE_FORMS).format(p=_coined(rng, syl, 2, 4)), None


_MAKERS = {"person": _person, "method": _method, "dataset": _dataset,
           "organization": _organization, "place": _place}


def names(n: int, *, seed: int, new: bool = False) -> Iterator[NameRecord]:
    """n records, unique by the key of every name and alias (new=True: absent from any store)."""
    rng = random.Random(f"names-{seed}-{new}")
    syl = NEW_SYLLABLES if new else SYLLABLES
    seen: set[str] = set()
    made = 0
    while made < n:
        etype = rng.choices(TYPES, TYPE_WEIGHTS)[0]
        name, alias = _MAKERS[etype](rng, syl)
        k = key(name)
        if k in seen or len(k) < 3:
            continue
        if alias is not None:
            ak = key(alias)
            if ak in seen or ak == k or len(ak) < 3:
                alias = None
            else:
                seen.add(ak)
        seen.add(k)
        made += 1
        yield NameRecord(display_form(name), etype, None if alias is None else display_form(alias))


def new_name(rng: random.Random) -> tuple[str, str]:
    """A name no generated store holds: coined from syllables names() never uses."""
    etype = rng.choices(TYPES, TYPE_WEIGHTS)[0]
    name, _ = _MAKERS[etype](rng, NEW_SYLLABLES)
    return name + f" {_coined(rng, NEW_SYLLABLES, 1, 2)}", etype


# -- perturbations ----------------------------------------------------------------------------

def case_variant(name: str) -> str:
    """Same casefolded form, different display form."""
    low = name.lower()
    return low if low != name else name.upper()


def punctuation_variant(name: str) -> str:
    """Same key, different casefolded form: spacing and hyphens moved around."""
    if " " in name:
        out = name.replace(" ", "-", 1) if "-" not in name else name.replace("-", " ")
    elif "-" in name:
        out = name.replace("-", "")
    else:
        out = name[: len(name) // 2] + "-" + name[len(name) // 2:]
    if key(out) != key(name) or out.casefold() == name.casefold():
        out = name + "."  # a trailing full stop: the key drops it
    return out


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def typo_variant(name: str, rng: random.Random) -> str | None:
    """One counting edit on a letter away from digits (SPEC rule 4), or None if none fits."""
    k = key(name)
    if len(k) < 7:  # the shorter key must keep 6+ characters after a deletion
        return None
    spots = [i for i, c in enumerate(name)
             if c.isalpha() and not any(ch.isdigit() for ch in name[max(0, i - 1): i + 2])]
    for _ in range(12):
        if not spots:
            return None
        i = rng.choice(spots)
        op = rng.choice(("sub", "del", "ins", "swap"))
        if op == "sub":
            out = name[:i] + rng.choice(_LETTERS.replace(name[i].lower(), "")) + name[i + 1:]
        elif op == "del":
            out = name[:i] + name[i + 1:]
        elif op == "ins":
            out = name[:i] + rng.choice(_LETTERS) + name[i:]
        else:
            if (i + 1 >= len(name) or not name[i + 1].isalpha()
                    or name[i].lower() == name[i + 1].lower()):
                continue
            out = name[:i] + name[i + 1] + name[i] + name[i + 2:]
        if key(out) != k and one_edit_apart(key(out), k):
            return out
    return None


__all__ = [
    "TYPES",
    "NameRecord",
    "case_variant",
    "names",
    "new_name",
    "punctuation_variant",
    "typo_variant",
]
