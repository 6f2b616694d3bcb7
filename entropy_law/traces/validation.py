"""Checks of trace tables against the trace format, shared by the writer (``log_columns``) and the readers.

Known here: the rules a valid table obeys (columns and types, value ranges, roles, consistency of one run's tables) and
the cheap checks of a run's shard files (``check_shard``, ``check_run_shards``: never the tokens). A failure raises
``TraceValidationError`` naming where and the first offending request, round or position.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from entropy_law.traces.schema import ROLES, SCHEMAS, STOP_REASONS, TABLES, added_columns


class TraceValidationError(ValueError):
    """A trace table breaks the v1 format; the message says what and where."""


def check_schema(schema: pa.Schema, table: str, where: str) -> None:
    """Every column of the v1 ``table`` present with its type; extra columns allowed, later-added ones may be absent."""
    expected = SCHEMAS[table]
    optional = set(added_columns(table))
    missing = [f.name for f in expected if f.name not in schema.names and f.name not in optional]
    if missing:
        raise TraceValidationError(f"{where}: {table} table is missing column(s) {missing}; a v1 {table} table has "
                                   f"{expected.names}")
    for f in expected:
        if f.name not in schema.names:
            continue  # an added column absent from an older file
        actual = schema.field(f.name).type
        if pa.types.is_dictionary(actual):
            actual = actual.value_type
        if actual != f.type and not (pa.types.is_large_string(actual) and f.type == pa.string()):
            raise TraceValidationError(f"{where}: {table} column {f.name!r} has type {actual}, the trace format "
                                       f"requires {f.type}")


def _np(tbl: pa.Table, name: str) -> np.ndarray:
    return tbl.column(name).to_numpy()


_ROW_LABELS = {"run_id": "run", "request_id": "request", "round_index": "round", "position": "position",
               "depth": "depth"}


def _describe(tbl: pa.Table, row: int, table: str) -> str:
    values = tbl.slice(row, 1).select([c for c in _ROW_LABELS if c in tbl.column_names]).to_pylist()[0]
    return f"{table} row {row} (" + ", ".join(f"{_ROW_LABELS[c]} {v!r}" for c, v in values.items()) + ")"


def _fail_first(mask: np.ndarray, tbl: pa.Table, table: str, where: str, problem: str, count_word="rows"):
    if mask.any():
        row = int(np.flatnonzero(mask)[0])
        raise TraceValidationError(f"{where}: {problem} in {int(mask.sum())} {count_word}; first at "
                                   f"{_describe(tbl, row, table)}")


def check_values(tbl: pa.Table, table: str, where: str) -> None:
    """Value rules of one table (no cross-table rules): nulls, ranges, roles, stop reasons."""
    check_schema(tbl.schema, table, where)
    for f in SCHEMAS[table]:
        if not f.nullable and tbl.column(f.name).null_count:
            mask = tbl.column(f.name).is_null().to_numpy(zero_copy_only=False)
            _fail_first(mask, tbl, table, where, f"null {f.name!r} (column may not be null)")
    if table == "tokens":
        _check_tokens(tbl, where)
    elif table == "rounds":
        _check_rounds(tbl, where)
    else:
        _check_requests(tbl, where)


def _bad(column: pa.ChunkedArray, condition) -> np.ndarray | None:
    """Row mask where ``condition(column)`` is true (nulls count as fine), or None if no row is bad."""
    flags = condition(column)
    if not pc.any(flags).as_py():
        return None
    return flags.fill_null(False).to_numpy(zero_copy_only=False)


def _check_tokens(tbl: pa.Table, where: str) -> None:
    t = "tokens"
    role = tbl.column("role")
    dictionaries_ok = all(set(c.dictionary.to_pylist()) <= set(ROLES) for c in role.chunks
                          if pa.types.is_dictionary(c.type))
    if not dictionaries_ok or not pa.types.is_dictionary(role.type):
        mask = _bad(role, lambda c: pc.invert(pc.is_in(c, value_set=pa.array(ROLES))))
        if mask is not None:
            _fail_first(mask, tbl, t, where, f"unknown role (allowed: {list(ROLES)})")
    checks = [
        ("depth", lambda c: pc.less(c, 1), "depth < 1 (depth is 1-based within the round)"),
        ("position", lambda c: pc.less(c, 0), "negative position"),
        ("round_index", lambda c: pc.less(c, 0), "negative round_index"),
        ("token_id", lambda c: pc.less(c, 0), "negative token_id"),
    ]
    for name in ("target_entropy_nats", "target_renyi2_nats"):
        checks += [(name, pc.is_nan, f"NaN {name}"),
                    (name, lambda c: pc.or_(pc.less(c, 0), pc.is_inf(c)), f"{name} negative or infinite")]
    for name in ("target_top1_prob", "target_top2_prob"):
        checks.append((name, lambda c: pc.invert(pc.and_(pc.greater_equal(c, 0), pc.less_equal(c, 1))),
                       f"{name} outside [0, 1] or NaN"))
    checks += [
        ("target_logit_gap", lambda c: pc.invert(pc.greater_equal(c, 0)), "target_logit_gap negative or NaN"),
        ("draft_prob", pc.is_nan, "NaN draft_prob (write null for a missing value)"),
        ("draft_prob", lambda c: pc.or_(pc.less(c, 0), pc.greater(c, 1)), "draft_prob outside [0, 1]"),
        ("draft_top1_prob", pc.is_nan, "NaN draft_top1_prob (write null for a missing value)"),
        ("draft_top1_prob", lambda c: pc.or_(pc.less(c, 0), pc.greater(c, 1)), "draft_top1_prob outside [0, 1]"),
        ("draft_entropy_nats", pc.is_nan, "NaN draft_entropy_nats (write null for a missing value)"),
        ("draft_entropy_nats", lambda c: pc.or_(pc.less(c, 0), pc.is_inf(c)),
         "draft_entropy_nats negative or infinite"),
        ("draft_rank", lambda c: pc.less(c, -1), "draft_rank < -1 (-1 means: not among the candidates)"),
        ("context_match", lambda c: pc.less(c, 0), "negative context_match (a suffix-match length)"),
        ("target_topk", lambda c: pc.less(c, 1), "target_topk < 1 (the top-k entries read)"),
    ]
    for name in ("target_entropy_lower_nats", "target_entropy_upper_nats", "target_entropy_estimate_nats"):
        checks += [(name, pc.is_nan, f"NaN {name} (write null for a missing value)"),
                   (name, lambda c: pc.or_(pc.less(c, 0), pc.is_inf(c)), f"{name} negative or infinite")]
    for name, condition, problem in checks:
        mask = _bad(tbl.column(name), condition)
        if mask is not None:
            _fail_first(mask, tbl, t, where, problem)
    lower, upper = tbl.column("target_entropy_lower_nats"), tbl.column("target_entropy_upper_nats")
    estimate = tbl.column("target_entropy_estimate_nats")
    for low, high, problem in ((lower, upper, "target_entropy_lower_nats > target_entropy_upper_nats"),
                               (lower, estimate, "target_entropy_estimate_nats below target_entropy_lower_nats"),
                               (estimate, upper, "target_entropy_estimate_nats above target_entropy_upper_nats")):
        if pc.any(pc.greater(low, high)).as_py():
            _fail_first(pc.greater(low, high).fill_null(False).to_numpy(zero_copy_only=False), tbl, t, where, problem)
    top1, top2 = tbl.column("target_top1_prob"), tbl.column("target_top2_prob")
    if pc.any(pc.greater(top2, top1)).as_py():
        _fail_first(pc.greater(top2, top1).to_numpy(zero_copy_only=False), tbl, t, where,
                    "target_top2_prob > target_top1_prob")


def _check_rounds(tbl: pa.Table, where: str) -> None:
    t = "rounds"
    block = _np(tbl, "block_size").astype(np.int64)
    depth = _np(tbl, "tree_depth").astype(np.int64)
    accepted = _np(tbl, "accepted").astype(np.int64)
    committed = _np(tbl, "committed").astype(np.int64)
    nodes = _np(tbl, "tree_nodes").astype(np.int64)
    _fail_first(block < 1, tbl, t, where, "block_size < 1")
    _fail_first(accepted < 0, tbl, t, where, "negative accepted (tau)")
    _fail_first(accepted > block - 1, tbl, t, where,
                "accepted (tau) larger than the block allows (tau <= block_size - 1)")
    _fail_first((depth < 0) | (depth > block - 1), tbl, t, where, "tree_depth outside [0, block_size - 1]")
    _fail_first(accepted > depth, tbl, t, where, "accepted (tau) > tree_depth")
    _fail_first(nodes < depth, tbl, t, where, "tree_nodes < tree_depth")
    _fail_first((committed < 1) | (committed > accepted + 1), tbl, t, where,
                "committed outside [1, accepted + 1]")
    _fail_first(_np(tbl, "start_position") < 0, tbl, t, where, "negative start_position")
    _fail_first(_np(tbl, "context_len") < 0, tbl, t, where, "negative context_len")
    _fail_first(_np(tbl, "round_index") < 0, tbl, t, where, "negative round_index")
    for name in ("draft_ms", "verify_ms", "overhead_ms"):
        values = _np(tbl, name)
        _fail_first(~(values >= 0) | np.isinf(values), tbl, t, where, f"{name} negative, infinite or NaN")


def _check_requests(tbl: pa.Table, where: str) -> None:
    t = "requests"
    ok = pc.is_in(tbl.column("stop_reason"), value_set=pa.array(STOP_REASONS)).to_numpy(zero_copy_only=False)
    _fail_first(~ok, tbl, t, where, f"unknown stop_reason (allowed: {list(STOP_REASONS)})")
    for name in ("prompt_tokens", "image_tokens", "new_tokens", "rounds"):
        _fail_first(_np(tbl, name) < 0, tbl, t, where, f"negative {name}")
    for name in ("prefill_ms", "decode_ms"):
        values = _np(tbl, name)
        _fail_first(~(values >= 0) | np.isinf(values), tbl, t, where, f"{name} negative, infinite or NaN")


def _request_codes(column: pa.ChunkedArray, ids: pa.Array) -> np.ndarray:
    """Index of each row's request id in ``ids`` (-1 when absent), without materialising strings."""
    parts = []
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):
            lookup = pc.index_in(chunk.dictionary, value_set=ids).fill_null(-1).to_numpy()
            parts.append(lookup[chunk.indices.to_numpy(zero_copy_only=False)])
        else:
            parts.append(pc.index_in(chunk, value_set=ids).fill_null(-1).to_numpy())
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _first_row(tbl: pa.Table, row: int) -> dict:
    return tbl.slice(row, 1).to_pylist()[0]


def check_run(tokens: pa.Table, rounds: pa.Table, requests: pa.Table, where: str) -> None:
    """Cross-table rules of one run: every row belongs to a logged request and round, tokens per round equal
    ``committed``, positions follow ``start_position``, round counts match ``requests``."""
    ids = _unique_request_ids(requests, where)
    r_code, r_order, r_sorted = _round_keys(rounds, requests, ids, where)
    groups = _token_groups(tokens, ids, where)
    _check_groups_are_rounds(groups, r_sorted, r_order, tokens, rounds, where)
    _check_round_tokens(groups, rounds, r_order, where)
    start_position = _np(rounds, "start_position").astype(np.int64)[r_order]
    committed = _np(rounds, "committed").astype(np.int64)[r_order]
    last = np.full(len(ids), -1, np.int64)  # requests.new_tokens covers every position
    np.maximum.at(last, r_code[r_order], start_position + committed - 1)
    _fail_first(last >= _np(requests, "new_tokens"), requests, "requests", where,
                "a token position >= requests.new_tokens", count_word="requests")


def _unique_request_ids(requests: pa.Table, where: str) -> pa.Array:
    ids_col = requests.column("request_id")
    ids = (ids_col.cast(ids_col.type.value_type) if pa.types.is_dictionary(ids_col.type) else ids_col)
    ids = ids.combine_chunks()
    counts = pc.value_counts(ids)
    dup = counts.field("counts").to_numpy() > 1
    if dup.any():
        raise TraceValidationError(
            f"{where}: request id {counts.field('values')[int(np.flatnonzero(dup)[0])].as_py()!r} "
            "appears in more than one requests row (request ids must be unique within a run)")
    return ids


def _round_keys(rounds: pa.Table, requests: pa.Table, ids: pa.Array, where: str):
    """Each round's request code, the order that sorts the rounds by (request, round), and the sorted keys; checks
    that rounds belong to a request, are unique and match ``requests.rounds``."""
    r_code = _request_codes(rounds.column("request_id"), ids)
    _fail_first(r_code < 0, rounds, "rounds", where, "round of a request with no requests row")
    r_key = (r_code.astype(np.int64) << 32) | _np(rounds, "round_index").astype(np.int64)
    r_order = np.argsort(r_key, kind="stable") if np.any(np.diff(r_key) < 0) else np.arange(len(r_key))
    r_sorted = r_key[r_order]
    repeated = np.flatnonzero(np.diff(r_sorted) == 0)
    if len(repeated):
        r = _first_row(rounds, int(r_order[repeated[0]]))
        raise TraceValidationError(f"{where}: request {r['request_id']!r} has round {r['round_index']} "
                                   "more than once in rounds")
    _fail_first(np.bincount(r_code, minlength=len(ids)) != _np(requests, "rounds"), requests, "requests", where,
                "requests.rounds differs from the number of rows in rounds")
    return r_code, r_order, r_sorted


def _token_groups(tokens: pa.Table, ids: pa.Array, where: str) -> dict:
    """The token rows grouped by (request, round) (sorted stably only where not already grouped): the group keys and
    starts, ``inner`` (row i + 1 continues row i's group) and per row depth, ``position - depth`` and whether accepted;
    ``order`` maps back to table rows (None: same)."""
    t_code = _request_codes(tokens.column("request_id"), ids)
    _fail_first(t_code < 0, tokens, "tokens", where, "token of a request with no requests row")
    t_round = _np(tokens, "round_index")
    depth = _np(tokens, "depth").astype(np.int32)
    offset = _np(tokens, "position") - depth
    role = tokens.column("role")
    is_acc = np.concatenate([
        (np.asarray(c.dictionary.to_pylist(), dtype=object) == "accepted")[c.indices.to_numpy(zero_copy_only=False)]
        if pa.types.is_dictionary(c.type) else pc.equal(c, "accepted").to_numpy(zero_copy_only=False)
        for c in role.chunks]) if role.num_chunks else np.zeros(0, bool)
    d_code, d_round = np.diff(t_code), np.diff(t_round)
    order = None
    if np.any((d_code < 0) | ((d_code == 0) & (d_round < 0))):
        order = np.lexsort((t_round, t_code))  # stable: keeps the order within a round
        t_code, t_round = t_code[order], t_round[order]
        depth, offset, is_acc = depth[order], offset[order], is_acc[order]
        d_code, d_round = np.diff(t_code), np.diff(t_round)
    inner = (d_code == 0) & (d_round == 0)
    starts = np.flatnonzero(np.r_[True, ~inner]) if len(t_code) else np.zeros(0, np.int64)
    keys = (t_code[starts].astype(np.int64) << 32) | t_round[starts].astype(np.int64)
    return dict(keys=keys, starts=starts, inner=inner, order=order, depth=depth, offset=offset, is_acc=is_acc,
                sizes=np.diff(np.r_[starts, len(t_code)]))


def _check_groups_are_rounds(groups: dict, r_sorted, r_order, tokens: pa.Table, rounds: pa.Table, where: str):
    """Token groups and rounds must be the same (request, round) pairs: else name the first that differs."""
    g_key, starts, order = groups["keys"], groups["starts"], groups["order"]
    if len(g_key) == len(r_sorted) and not np.any(g_key != r_sorted):
        return
    if np.any(np.diff(g_key) == 0):
        g = int(np.flatnonzero(np.diff(g_key) == 0)[0]) + 1
        t = _first_row(tokens, int(starts[g]) if order is None else int(order[starts[g]]))
        raise TraceValidationError(f"{where}: token rows of request {t['request_id']!r} round "
                                   f"{t['round_index']} are not contiguous")
    missing = np.setdiff1d(g_key, r_sorted)
    if len(missing):
        row = int(starts[np.searchsorted(g_key, missing[0])])
        t = _first_row(tokens, int(order[row]) if order is not None else row)
        raise TraceValidationError(f"{where}: tokens of request {t['request_id']!r} round "
                                   f"{t['round_index']} have no row in rounds")
    absent = np.setdiff1d(r_sorted, g_key)
    r = _first_row(rounds, int(r_order[np.searchsorted(r_sorted, absent[0])]))
    raise TraceValidationError(f"{where}: number of token rows differs from rounds.committed; request "
                               f"{r['request_id']!r} round {r['round_index']} has 0 token rows but "
                               f"committed={r['committed']}")


def _check_round_tokens(groups: dict, rounds: pa.Table, r_order, where: str) -> None:
    """Each round's token rows: ``committed`` of them, depths 1..committed, positions, accepted count."""
    starts, inner, n = groups["starts"], groups["inner"], groups["sizes"]
    committed = _np(rounds, "committed").astype(np.int64)[r_order]

    def fail_rounds(mask, problem):
        if mask.any():
            g = int(np.flatnonzero(mask)[0])
            r = _first_row(rounds, int(r_order[g]))
            raise TraceValidationError(
                f"{where}: {problem} in {int(mask.sum())} rounds; first at request {r['request_id']!r} "
                f"round {r['round_index']} (committed={r['committed']}, {int(n[g])} token rows)")

    def bad_groups(row_mask, first_bad):
        bad = np.zeros(len(starts), bool)
        bad[np.unique(np.searchsorted(starts, np.flatnonzero(row_mask), side="right") - 1)] = True
        return bad | first_bad

    fail_rounds(n != committed, "number of token rows differs from rounds.committed")
    if not len(starts):
        return
    depth, offset = groups["depth"], groups["offset"]
    fail_rounds(bad_groups(inner & (np.diff(depth) != 1), depth[starts] != 1),
                "token depths are not 1, 2, ..., committed in order")
    start_position = _np(rounds, "start_position").astype(np.int64)[r_order]
    fail_rounds(bad_groups(inner & (np.diff(offset) != 0), offset[starts] != start_position - 1),
                "token positions differ from start_position + depth - 1")
    accepted = _np(rounds, "accepted").astype(np.int64)[r_order]
    fail_rounds(np.add.reduceat(groups["is_acc"], starts, dtype=np.int64) != np.minimum(accepted, committed),
                "number of 'accepted' token rows differs from min(accepted, committed)")


def _shard_file(shard: Path, table: str) -> Path:
    return Path(shard) / f"{table}.parquet"


def check_shard(shard: Path) -> pa.Array:
    """The request ids of one finished shard, after the checks that need no token row: each table file readable with the
    v1 columns, and the row counts ``sum(requests.rounds)`` and ``sum(rounds.committed)``."""
    shard = Path(shard)
    meta = {}
    for table in TABLES:
        file = _shard_file(shard, table)
        if not file.is_file():
            raise TraceValidationError(f"{shard}: shard has no {file.name} (a shard holds "
                                       f"{', '.join(_shard_file(shard, t).name for t in TABLES)}); it is damaged")
        try:
            meta[table] = pq.read_metadata(file)
        except (pa.ArrowInvalid, OSError) as err:
            raise TraceValidationError(f"{file}: cannot read as Parquet ({err}); the shard is damaged") from err
        check_schema(meta[table].schema.to_arrow_schema(), table, str(file))
    try:
        requests = pq.read_table(_shard_file(shard, "requests"), columns=["request_id", "rounds"])
        committed = pq.read_table(_shard_file(shard, "rounds"), columns=["committed"]).column(0)
    except (pa.ArrowInvalid, OSError) as err:
        raise TraceValidationError(f"{shard}: cannot read its requests or rounds ({err}); the shard is "
                                   "damaged") from err
    for table, expected, rule in (
            ("rounds", pc.sum(requests.column("rounds")).as_py() or 0,
             "requests.rounds differs from the number of rows in rounds"),
            ("tokens", pc.sum(committed).as_py() or 0, "number of token rows differs from rounds.committed")):
        if meta[table].num_rows != expected:
            raise TraceValidationError(
                f"{_shard_file(shard, table)}: {rule} ({meta[table].num_rows} rows, {expected} expected); a file "
                "was cut off or replaced: the shard is damaged")
    ids = requests.column("request_id").combine_chunks()
    return ids.dictionary_decode() if pa.types.is_dictionary(ids.type) else ids


def check_unique_request_ids(ids_per_shard: list[tuple[Path, pa.Array]], where: str) -> None:
    """A request is written once: raise if a request id lies in two shards (or twice in one)."""
    if not ids_per_shard:
        return
    ids = pa.chunked_array([i.cast(pa.string()) for _, i in ids_per_shard], type=pa.string())
    counts = pc.value_counts(ids)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if not len(repeated):
        return
    rid = repeated[0]["values"].as_py()
    holders = []  # the shard of each of its rows
    for shard, i in ids_per_shard:
        holders += [shard] * (pc.sum(pc.equal(i.cast(pa.string()), rid)).as_py() or 0)
    place = (f"twice in {holders[0]}" if holders[0] == holders[1]
             else f"in more than one shard ({holders[0].name} and {holders[1].name})")
    raise TraceValidationError(
        f"{where}: request id {rid!r} appears {place} (a request is written once; was a shard copied, or a run "
        "resumed without skipping completed_requests?); move the extra shard out of the run's shards folder")


def check_run_shards(shards: list[Path], where: str, *, damaged: list | None = None) -> dict[str, Path]:
    """``check_shard`` on each shard, then request ids unique across them: request id -> its shard. ``damaged``: None
    raises on the first damaged shard; a list collects ``(shard, message)`` and skips its ids."""
    checked = []
    for shard in shards:
        try:
            checked.append((Path(shard), check_shard(shard)))
        except TraceValidationError as err:
            if damaged is None:
                raise
            damaged.append((Path(shard), str(err)))
    check_unique_request_ids(checked, where)
    return {rid: shard for shard, ids in checked for rid in ids.to_pylist()}
