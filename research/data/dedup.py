"""Exact and near de-duplication of records, deterministic and memory-frugal.

Whenever records collide, the one with the smallest ``_rank`` survives, so every run
and every runner keeps the same record. Both transforms decide *which ranks to drop*
from compact keys (32-bit key and id pairs, packed many to a shuffle element) and
only then filter the records against that small set: full records never cross a
shuffle. That matters on Beam's in-process runner, which holds whatever crosses a
shuffle or waits for a side input in memory, several times over. Keys are only a
sieve: a key or id collision adds records to compare, and the decision is always made
on full evidence (a 128-bit digest, or a MinHash signature) in rank order.

Near duplicates are found with MinHash and locality-sensitive hashing (LSH):

- shingles are word or character n-grams of the case-folded text, hashed with a
  stable hash (BLAKE2b for words, code points for characters, mixed n at a time);
- each of ``num_perm`` hash functions ``(a*x + b) mod (2**61 - 1)`` with ``a, b`` from
  a fixed-seed generator maps the shingles, and the signature keeps each minimum. The
  arithmetic is exact and vectorised (numpy uint64), with ``x`` the top 32 bits of the
  shingle hash;
- the signature is cut into ``bands`` bands of ``rows`` rows, chosen to minimise the
  false positive plus false negative probability around the threshold; records that
  share a band's hash are candidates, and a candidate is dropped only when its
  estimated Jaccard similarity to a smaller-ranked member reaches the threshold.

Every record removed goes to the ``dropped`` output with the origin of the record kept
in its place and their similarity, for ``dropped.jsonl`` (research.data.rejects).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Protocol

import apache_beam as beam
import numpy as np

from research.data import records
from research.data.records import (
    DROPPED_TAG,
    ORIGIN,
    RANK,
    Record,
    dropped_entry,
    pack_records,
    unpack_records,
)
from research.data.spec import NearDedupSpec

MERSENNE_PRIME = (1 << 61) - 1
# Above every hash value: the signature of a text without shingles.
EMPTY_HASH = MERSENNE_PRIME
PERMUTATION_SEED = 20_240_501
_U64 = np.uint64
_U32 = np.uint32
_MASK32 = _U64(0xFFFFFFFF)

# Records per batch when computing keys; shuffle keys per batch = partitions (x bands).
BATCH_SIZE = 2048
PARTITIONS = 32
# Each member of an LSH bucket is checked against at most this many smaller-ranked
# members (the smallest ones, which are the records that survive), so one huge bucket
# costs linear rather than quadratic time.
MAX_COMPARISONS = 64
# How LSH errors are weighed when choosing bands x rows. A false positive only costs a
# signature comparison, a false negative is a duplicate that stays: favour recall.
FALSE_POSITIVE_WEIGHT = 0.2
FALSE_NEGATIVE_WEIGHT = 0.8
# numpy elements per (shingles x permutations) block: small enough to stay in cache.
_BLOCK_ELEMENTS = 1 << 16

_WORD = re.compile(r"\w+")

Shingle = Literal["word", "char"]
# One verdict: (dropped rank, rank of the earlier record it repeats, that record's
# origin, their similarity).
Verdict = tuple[str, str, str, float]


# --------------------------------------------------------------------------- hashing


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a fixed bijection of uint64 that spreads every input bit."""
    values = values ^ (values >> _U64(30))
    values = values * _U64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> _U64(27))
    values = values * _U64(0x94D049BB133111EB)
    return values ^ (values >> _U64(31))


@lru_cache(maxsize=1 << 18)
def _word_hash(word: str) -> int:
    digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def record_id(rank: str) -> int:
    """A 32-bit stand-in for a rank in LSH buckets, where ranks are too bulky to carry.

    Ids may collide. That only adds records to compare: ranks and signatures decide
    what is dropped, so a collision never drops a record.
    """
    digest = hashlib.blake2b(rank.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def _units(texts: Sequence[str], shingle: Shingle) -> tuple[np.ndarray, np.ndarray]:
    """Every text's words (hashed) or characters (code points), concatenated, and lengths."""
    if shingle == "word":
        split = [words(text) for text in texts]
        lengths = np.fromiter((len(w) for w in split), dtype=np.int64, count=len(texts))
        hashed = [_word_hash(word) for text_words in split for word in text_words]
        return np.array(hashed, dtype=_U64), lengths
    folded = [" ".join(text.casefold().split()) for text in texts]
    lengths = np.fromiter((len(t) for t in folded), dtype=np.int64, count=len(texts))
    joined = "".join(folded).encode("utf-32-le", "surrogatepass")  # JSON allows lone ones
    points = np.frombuffer(joined, dtype="<u4")
    return points.astype(_U64), lengths


def words(text: str) -> list[str]:
    """The words of a text as word shingles see them: case-folded, punctuation dropped."""
    return _WORD.findall(text.casefold())


def _ngrams(units: np.ndarray, ngram: int) -> np.ndarray:
    """Hash every run of ``ngram`` consecutive units (order matters, stable across runs)."""
    count = len(units) - ngram + 1
    hashes = _mix(units[:count])
    for offset in range(1, ngram):
        hashes = _mix(hashes ^ units[offset : offset + count])
    return hashes


def _batch_shingles(
    texts: Sequence[str], shingle: Shingle, ngram: int
) -> tuple[np.ndarray, np.ndarray]:
    """The shingle hashes of many texts at once, and which text each belongs to.

    A text shorter than ``ngram`` units has one shingle (all its units), so short texts
    still compare; an empty text has none.
    """
    units, lengths = _units(texts, shingle)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    owners = np.repeat(np.arange(len(texts)), lengths)
    parts: list[np.ndarray] = []
    part_owners: list[np.ndarray] = []
    if len(units) >= ngram:
        hashes = _ngrams(units, ngram)
        window_owner = owners[: len(hashes)]
        inside = np.arange(len(hashes)) + ngram <= ends[window_owner]
        parts.append(hashes[inside])
        part_owners.append(window_owner[inside])
    for index in np.flatnonzero((lengths > 0) & (lengths < ngram)):
        parts.append(_ngrams(units[starts[index] : ends[index]], int(lengths[index])))
        part_owners.append(np.array([index]))
    if not parts:
        return np.empty(0, dtype=_U64), np.empty(0, dtype=np.int64)
    hashes = np.concatenate(parts)
    owner = np.concatenate(part_owners)
    order = np.argsort(owner, kind="stable")
    return hashes[order], owner[order]


def shingle_hashes(text: str, shingle: Shingle = "word", ngram: int = 3) -> np.ndarray:
    """The distinct shingle hashes of one text, sorted (uint64)."""
    hashes, _ = _batch_shingles([text], shingle, ngram)
    return np.unique(hashes)


# --------------------------------------------------------------------------- MinHash


@lru_cache(maxsize=16)
def permutations(num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``a`` and ``b`` of every hash function: fixed, so signatures never vary."""
    generator = np.random.default_rng(PERMUTATION_SEED)
    a = generator.integers(1, MERSENNE_PRIME, size=num_perm, dtype=_U64)
    b = generator.integers(0, MERSENNE_PRIME, size=num_perm, dtype=_U64)
    a.flags.writeable = False
    b.flags.writeable = False
    return a, b


def _minhash(hashes: np.ndarray, owner: np.ndarray, count: int, num_perm: int) -> np.ndarray:
    """Signatures of ``count`` shingle sets given as hashes tagged with their set index.

    Each block of shingles (rows) is mapped by every hash function (columns) in three
    reused buffers: fresh large temporaries cost more in page faults than the arithmetic.
    ``a * x`` needs up to 93 bits, so ``a`` is split into 32-bit halves and each partial
    product folded with ``2**61 = 1 (mod p)``; every step stays below ``2**64``.
    """
    a, b = permutations(num_perm)
    a_high, a_low = a >> _U64(32), a & _MASK32
    prime = _U64(MERSENNE_PRIME)
    signatures = np.full((count, num_perm), EMPTY_HASH, dtype=_U64)
    step = max(1, _BLOCK_ELEMENTS // num_perm)
    shape = (min(step, len(hashes)), num_perm)
    buffers = [np.empty(shape, dtype=_U64) for _ in range(3)]
    for begin in range(0, len(hashes), step):
        x = (hashes[begin : begin + step] >> _U64(32))[:, None]
        low, high, carry = (buffer[: len(x)] for buffer in buffers)
        np.multiply(x, a_low, out=low)  # < 2**64
        np.multiply(x, a_high, out=high)  # < 2**61, to be multiplied by 2**32
        np.right_shift(high, _U64(29), out=carry)  # the part worth 2**61 = 1
        high &= _U64((1 << 29) - 1)
        high <<= _U64(32)  # the rest, < 2**61
        carry += high
        _fold(low, high, prime)
        low += carry
        low += b  # < 2**63
        _fold(low, high, prime)
        np.subtract(low, prime, out=high)  # wraps around unless low >= p
        np.minimum(low, high, out=low)
        block_owner = owner[begin : begin + step]
        first = np.flatnonzero(np.r_[True, block_owner[1:] != block_owner[:-1]])
        rows = block_owner[first]
        signatures[rows] = np.minimum(signatures[rows], np.minimum.reduceat(low, first, axis=0))
    return signatures


def _fold(values: np.ndarray, scratch: np.ndarray, prime: np.uint64) -> None:
    """In place: a congruent value mod ``2**61 - 1`` below ``2**61 + 8``."""
    np.right_shift(values, _U64(61), out=scratch)
    values &= prime
    values += scratch


def minhash_signature(hashes: np.ndarray, num_perm: int = 128) -> np.ndarray:
    """The MinHash signature (uint64, length ``num_perm``) of one set of shingle hashes."""
    hashes = np.asarray(hashes, dtype=_U64)
    return _minhash(hashes, np.zeros(len(hashes), dtype=np.int64), 1, num_perm)[0]


def text_signatures(
    texts: Sequence[str], shingle: Shingle = "word", ngram: int = 3, num_perm: int = 128
) -> np.ndarray:
    """Signatures of many texts, one row each, computed together for speed."""
    hashes, owner = _batch_shingles(texts, shingle, ngram)
    return _minhash(hashes, owner, len(texts), num_perm)


def estimate_jaccard(first: np.ndarray, second: np.ndarray) -> float:
    """Fraction of agreeing signature positions: an unbiased Jaccard estimate."""
    if first.shape != second.shape:
        raise ValueError(f"signatures differ in length: {first.shape} vs {second.shape}")
    return float(np.count_nonzero(first == second)) / len(first)


# --------------------------------------------------------------------------- LSH


@lru_cache(maxsize=64)
def optimal_lsh_params(
    threshold: float,
    num_perm: int,
    false_positive_weight: float = 0.5,
    false_negative_weight: float = 0.5,
) -> tuple[int, int]:
    """The (bands, rows) with ``bands * rows <= num_perm`` minimising the weighted error.

    Two sets of similarity s share some band with probability ``1 - (1 - s**r)**b``.
    The false positive probability integrates it over s below the threshold, the false
    negative probability integrates its complement above, as datasketch does.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    below = np.linspace(0.0, threshold, 1001)
    above = np.linspace(threshold, 1.0, 1001)
    best, best_error = (1, 1), math.inf
    for bands in range(1, num_perm + 1):
        rows = np.arange(1, num_perm // bands + 1, dtype=np.float64)[:, None]
        false_positive = np.trapezoid(1.0 - (1.0 - below**rows) ** bands, below, axis=1)
        false_negative = np.trapezoid((1.0 - above**rows) ** bands, above, axis=1)
        errors = false_positive_weight * false_positive + false_negative_weight * false_negative
        index = int(np.argmin(errors))
        if errors[index] < best_error:
            best, best_error = (bands, index + 1), float(errors[index])
    return best


def band_hashes(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One uint64 per (record, band): records agreeing on a band's rows share its hash."""
    if bands * rows > signatures.shape[1]:
        raise ValueError(f"{bands} bands x {rows} rows exceed {signatures.shape[1]} values")
    out = np.empty((signatures.shape[0], bands), dtype=_U64)
    for band in range(bands):
        hashes = np.full(signatures.shape[0], band, dtype=_U64)
        for column in range(band * rows, (band + 1) * rows):
            hashes = _mix(hashes ^ signatures[:, column])
        out[:, band] = hashes
    return out


# --------------------------------------------------------------------------- Beam
#
# Both transforms run the same plan, differing only in their ``_Method``:
#
# 1. per batch of records, a method computes 32-bit keys (a content digest prefix for
#    exact, band hashes for near) and emits (key, record id) pairs packed per hash
#    partition; the records themselves are packed into compressed batches;
# 2. a shuffle per partition finds the keys shared by several records: buckets of ids;
# 3. a second pass over the packed records, with the (small) bucket membership table as
#    a side input, emits each bucketed record's rank, origin and evidence (full digest,
#    or signature) to its buckets;
# 4. per bucket, in rank order, the method names the records that repeat an earlier
#    one and which one; their ranks are removed from the packed records.


class _Method(Protocol):
    """How one kind of de-duplication keys, evidences and judges records."""

    counter: str
    kind: str  # "exact" or "near", for people reading dropped.jsonl

    def keys(self, batch: list[Record]) -> tuple[np.ndarray, np.ndarray]:
        """(indices of the records that take part, their uint32 keys: one column each)."""

    def evidence(self, batch: list[Record]) -> list[bytes]:
        """What decides whether two records in a bucket are duplicates."""

    def duplicate_rows(self, evidence: list[bytes]) -> Iterable[tuple[int, int, float]]:
        """(row, earlier row it duplicates, similarity) for rows in rank order."""


@dataclass(frozen=True)
class _Exact:
    fields: tuple[str, ...] | None
    counter: str = "dedup.exact.merged"
    kind: str = "exact"

    def _digests(self, batch: list[Record]) -> list[bytes]:
        fields = list(self.fields) if self.fields is not None else None
        return [records.content_digest(record, fields) for record in batch]

    def keys(self, batch: list[Record]) -> tuple[np.ndarray, np.ndarray]:
        prefixes = b"".join(digest[:4] for digest in self._digests(batch))
        return np.arange(len(batch)), np.frombuffer(prefixes, dtype=_U32).reshape(-1, 1)

    def evidence(self, batch: list[Record]) -> list[bytes]:
        return [digest[:16] for digest in self._digests(batch)]

    def duplicate_rows(self, evidence: list[bytes]) -> Iterable[tuple[int, int, float]]:
        first: dict[bytes, int] = {}
        for row, digest in enumerate(evidence):
            if digest in first:
                yield row, first[digest], 1.0
            first.setdefault(digest, row)


@dataclass(frozen=True)
class _Near:
    spec: NearDedupSpec
    bands: int
    rows: int
    counter: str = "dedup.near.merged"
    kind: str = "near"

    def _signatures(self, batch: list[Record]) -> np.ndarray:
        texts = [value if isinstance(value := r.get(self.spec.field), str) else "" for r in batch]
        return text_signatures(texts, self.spec.shingle, self.spec.ngram, self.spec.num_perm)

    def keys(self, batch: list[Record]) -> tuple[np.ndarray, np.ndarray]:
        signatures = self._signatures(batch)
        present = np.flatnonzero(signatures[:, 0] != _U64(EMPTY_HASH))  # no text, no shingles
        hashes = band_hashes(signatures[present], self.bands, self.rows)
        return present, (hashes >> _U64(32)).astype(_U32)

    def evidence(self, batch: list[Record]) -> list[bytes]:
        # The low 32 bits of each value are plenty to tell equal values apart. A record
        # without shingles (in a bucket by an id collision) has no evidence to compare.
        signatures = self._signatures(batch)
        compact = (signatures & _MASK32).astype(_U32)
        empty = signatures[:, 0] == _U64(EMPTY_HASH)
        return [b"" if none else row.tobytes() for row, none in zip(compact, empty, strict=True)]

    def duplicate_rows(self, evidence: list[bytes]) -> Iterable[tuple[int, int, float]]:
        rows = [row for row, proof in enumerate(evidence) if proof]
        if len(rows) < 2:
            return []
        matrix = np.frombuffer(b"".join(evidence[row] for row in rows), dtype=_U32)
        needed = math.ceil(self.spec.threshold * self.spec.num_perm - 1e-9)
        return [
            (rows[row], rows[match], agree / self.spec.num_perm)
            for row, match, agree in near_duplicate_rows(matrix.reshape(len(rows), -1), needed)
        ]


class DeduplicateExact(beam.PTransform):
    """Keep one record per identical content: the one with the smallest rank.

    Content is the SHA-256 of the canonical serialisation of ``fields`` (every public
    field when None). Outputs ``records`` and ``dropped`` (dropped.jsonl entries);
    counter ``dedup.exact.merged`` counts the records removed.
    """

    def __init__(self, fields: list[str] | None = None) -> None:
        super().__init__()
        self._method = _Exact(tuple(fields) if fields is not None else None)

    def expand(self, pcoll: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return pcoll | _Deduplicate(self._method)


class DeduplicateNear(beam.PTransform):
    """Drop records whose text is a near duplicate of a smaller-ranked record's.

    Records without text (None or no shingles) are never near duplicates. Outputs
    ``records`` and ``dropped`` (dropped.jsonl entries); counter ``dedup.near.merged``
    counts the records removed.
    """

    def __init__(self, spec: NearDedupSpec) -> None:
        super().__init__()
        bands, rows = optimal_lsh_params(
            spec.threshold, spec.num_perm, FALSE_POSITIVE_WEIGHT, FALSE_NEGATIVE_WEIGHT
        )
        self._method = _Near(spec, bands, rows)

    def expand(self, pcoll: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return pcoll | _Deduplicate(self._method)


class _Deduplicate(beam.PTransform):
    def __init__(self, method: _Method) -> None:
        super().__init__()
        self._method = method

    def expand(self, pcoll: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        method = self._method
        batches = pcoll | "Batch" >> beam.BatchElements(
            min_batch_size=BATCH_SIZE, max_batch_size=BATCH_SIZE, record_metrics=False
        )
        memberships = (
            batches
            | "Keys" >> beam.FlatMap(_key_partitions, method)
            | "ShuffleKeys" >> beam.GroupByKey()
            | "Buckets" >> beam.FlatMap(_shared_keys)
            | "Memberships" >> beam.Map(_membership_rows)
            | "CollectMemberships" >> beam.combiners.ToList().without_defaults()
            | "MembershipTable" >> beam.Map(_membership_table)
        )
        packed = batches | "Pack" >> beam.Map(pack_records)
        drops = (
            packed
            | "Evidence"
            >> beam.ParDo(
                _EvidenceToBuckets(method), beam.pvalue.AsSingleton(memberships, default_value=b"")
            )
            | "ShuffleBuckets" >> beam.GroupByKey()
            | "Judge" >> beam.FlatMap(_judge_bucket, method)
        )
        return packed | "Remove" >> beam.ParDo(
            _RemoveRanks(method), beam.pvalue.AsList(drops)
        ).with_outputs(DROPPED_TAG, main="records")


def _key_partitions(batch: list[Record], method: _Method) -> Iterator[tuple[int, bytes]]:
    """(column x partition, packed [(key, record id)...]) for each key column and partition."""
    present, keys = method.keys(batch)
    if not len(present):
        return
    ids = np.array([record_id(batch[i][RANK]) for i in present], dtype=_U32)
    shift = _U32(32 - int(math.log2(PARTITIONS)))
    for column in range(keys.shape[1]):
        values = keys[:, column]
        partitions = values >> shift
        order = np.argsort(partitions, kind="stable")
        ordered = partitions[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        for begin, end in zip(starts, np.r_[starts[1:], len(order)], strict=True):
            chosen = order[begin:end]
            packed = np.stack([values[chosen], ids[chosen]], axis=1).tobytes()
            yield column * PARTITIONS + int(ordered[begin]), packed


def _shared_keys(item: tuple[int, Iterable[bytes]]) -> Iterator[bytes]:
    """The record ids (sorted, packed) of every key that two or more records share."""
    entries = np.frombuffer(b"".join(item[1]), dtype=_U32).reshape(-1, 2)
    entries = entries[np.lexsort((entries[:, 1], entries[:, 0]))]
    keys = entries[:, 0]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    for begin, end in zip(starts, np.r_[starts[1:], len(keys)], strict=True):
        if end - begin > 1:
            yield entries[begin:end, 1].tobytes()


def _membership_rows(bucket: bytes) -> bytes:
    """Packed (record id, bucket key) rows; equal buckets (other bands) share their key."""
    ids = np.frombuffer(bucket, dtype=_U32).astype(_U64)
    key = int.from_bytes(hashlib.blake2b(bucket, digest_size=8).digest(), "little") >> 1
    return np.stack([ids, np.full(len(ids), key, dtype=_U64)], axis=1).tobytes()


def _membership_table(rows: list[bytes]) -> bytes:
    """Every distinct (record id, bucket key) row, sorted, as one packed array."""
    table = np.frombuffer(b"".join(rows), dtype=_U64).reshape(-1, 2)
    return np.unique(table, axis=0).tobytes()


class _EvidenceToBuckets(beam.DoFn):
    """(bucket key, (rank, origin, evidence)) for every bucket each record sits in.

    Evidence (digests, signatures) is recomputed for the few bucketed records rather
    than carried through the shuffle for all of them.
    """

    def __init__(self, method: _Method) -> None:
        self._method = method
        self._source: bytes | None = None
        self._table = np.empty((0, 2), dtype=_U64)

    def process(
        self, packed: bytes, memberships: bytes
    ) -> Iterator[tuple[int, tuple[str, str, bytes]]]:
        if memberships is not self._source:  # the runner hands the same value within a bundle
            self._source = memberships
            self._table = np.frombuffer(memberships, dtype=_U64).reshape(-1, 2)
        if not len(self._table):
            return
        batch = unpack_records(packed)
        ids = np.array([record_id(record[RANK]) for record in batch], dtype=_U64)
        first = np.searchsorted(self._table[:, 0], ids, side="left")
        last = np.searchsorted(self._table[:, 0], ids, side="right")
        chosen = np.flatnonzero(last > first)
        evidence = self._method.evidence([batch[i] for i in chosen])
        for index, proof in zip(chosen, evidence, strict=True):
            value = (batch[index][RANK], str(batch[index].get(ORIGIN, "")), proof)
            for key in self._table[first[index] : last[index], 1]:
                yield int(key), value


def _judge_bucket(
    item: tuple[int, Iterable[tuple[str, str, bytes]]], method: _Method
) -> Iterator[Verdict]:
    """A verdict for each record in a bucket that the method finds repeating a smaller rank."""
    members = {rank: (origin, proof) for rank, origin, proof in item[1]}
    ranks = sorted(members)
    for row, match, similarity in method.duplicate_rows([members[r][1] for r in ranks]):
        yield ranks[row], ranks[match], members[ranks[match]][0], similarity


def _first_verdicts(verdicts: Iterable[Verdict]) -> dict[str, Verdict]:
    """One verdict per dropped rank: the one naming the smallest earlier rank.

    A record may repeat different records in different buckets (LSH bands); choosing by
    rank makes dropped.jsonl the same on every run.
    """
    chosen: dict[str, Verdict] = {}
    for verdict in sorted(verdicts):
        chosen.setdefault(verdict[0], verdict)
    return chosen


def _reason(verdict: Verdict, kept: Verdict, kind: str) -> str:
    """Why a record was dropped; a chain (c repeats b, b repeats a) names both."""
    _, matched_rank, matched_origin, similarity = verdict
    reason = f"{kind} duplicate of {matched_origin} (similarity {similarity:.2f})"
    if kept[1] != matched_rank:
        reason += f", itself a duplicate of {kept[2]}, which was kept"
    return reason


class _RemoveRanks(beam.DoFn):
    """Unpack record batches: records not judged duplicates go on, the others to ``dropped``."""

    def __init__(self, method: _Method) -> None:
        self._counter = method.counter
        self._kind = method.kind
        self._source: list[Verdict] | None = None
        self._verdicts: dict[str, Verdict] = {}

    def _kept(self, verdict: Verdict) -> Verdict:
        """The verdict naming the record that survives: follow a chain of duplicates."""
        while verdict[1] in self._verdicts:  # ranks only decrease along a chain
            verdict = self._verdicts[verdict[1]]
        return verdict

    def process(self, packed: bytes, verdicts: list[Verdict]) -> Iterator[Any]:
        if verdicts is not self._source:  # the runner hands the same list within a bundle
            self._source, self._verdicts = verdicts, _first_verdicts(verdicts)
        removed = 0
        for record in unpack_records(packed):
            verdict = self._verdicts.get(record[RANK])
            if verdict is None:
                yield record
                continue
            removed += 1
            kept = self._kept(verdict)
            entry = dropped_entry(
                record,
                "dedup",
                self._counter,
                _reason(verdict, kept, self._kind),
                kept=kept[2],
                similarity=round(verdict[3], 4),
            )
            yield beam.pvalue.TaggedOutput(DROPPED_TAG, entry)
        if removed:
            records.count(self._counter, removed)


def near_duplicate_rows(signatures: np.ndarray, needed: int) -> list[tuple[int, int, int]]:
    """(row, first earlier row it agrees with in ``needed`` positions, positions agreeing).

    Rows come in rank order. Each row is compared with at most ``MAX_COMPARISONS`` earlier
    rows: the first ones, the records most likely to be kept.
    """
    reference = signatures[:MAX_COMPARISONS]
    duplicates: list[tuple[int, int, int]] = []
    chunk = max(1, _BLOCK_ELEMENTS // max(1, reference.size))
    for begin in range(1, len(signatures), chunk):
        rows = signatures[begin : begin + chunk]
        agree = (rows[:, None, :] == reference[None, :, :]).sum(axis=2)
        earlier = np.arange(len(reference))[None, :] < np.arange(begin, begin + len(rows))[:, None]
        hits = (agree >= needed) & earlier
        for row in np.flatnonzero(hits.any(axis=1)):
            match = int(np.argmax(hits[row]))  # the first True: the smallest rank
            duplicates.append((int(begin + row), match, int(agree[row, match])))
    return duplicates
