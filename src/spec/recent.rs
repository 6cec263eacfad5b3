//! A table's metadata with only its recent snapshots: what following a table needs, parsed at a cost that does not
//! grow with the table's history.
//!
//! A metadata file lists every snapshot the table keeps (and a log entry for each), so a table with a long history
//! has a large file, and iceberg-rust parses all of it: each snapshot with its summary map, through serde's buffered
//! untagged enum. A loop that follows the table needs the snapshots from the one its sinks recorded on. So
//! [`parse_recent`] first walks the document's structure only (brackets and strings, no values decoded, no
//! allocation per snapshot), drops the snapshots older than a sequence number and their log entries, and hands the
//! rest — the same document, shorter — to iceberg-rust's parser, which validates what is kept as usual. The walk
//! reads 64 bytes at a time as bit masks of quotes and brackets ([`brackets`]); one pass over an array gives the
//! bounds of all its elements ([`elements`]), and only the first members of each (its ids) are read.
//!
//! Even the walk grows with the history (a few ms per MB), so it resumes where the last one ended: writers append to
//! `snapshots` and `snapshot-log`, and a table's next metadata file starts both arrays with the bytes its previous
//! file had there. A walk leaves a [`Memo`] (each array's length and keyed hash up to its last element, and the
//! elements it kept); the next walk hashes that many bytes of the new array (GB/s, against the walk's hundreds of
//! MB/s) and, when they match, walks only the elements after them. The hash is chained over the pieces each walk
//! added ([`chained`]), so that the next memo's hash continues the one just checked: each byte is hashed once per
//! walk, not twice (a long history's arrays are megabytes); past [`MAX_PIECES`] pieces a walk hashes its prefix
//! again as one. Whatever does not match (snapshots expired, a
//! file rewritten by another writer, a walk from an older sequence number, a named snapshot the last walk dropped)
//! is walked in full, so a memo changes the cost, never the result. A file listing its snapshots out of commit order
//! (iceberg-rust writes them in a hash map's order) leaves no memo: its writer does not append.
//!
//! Invariants: every member other than `snapshots` and `snapshot-log` is passed on byte for byte; a kept snapshot or
//! log entry is passed on byte for byte; kept are the snapshots with a sequence number at or above `since`, the
//! current one and every one a ref names (iceberg-rust checks refs). Anything the walk does not understand (not an
//! object, a key with an escape, a number that does not parse, gzip) means no trimming: the whole file is parsed as
//! before, and its errors are the parser's. Dropping snapshots changes what lineage walks see: they stop at the
//! oldest kept snapshot, as at an expired one — callers check that what they need is kept
//! ([`holds_lineage`]).
use std::collections::HashSet;
use std::ops::Range;
use std::sync::OnceLock;

use iceberg::spec::TableMetadata;

/// Parses metadata file `bytes`, keeping the snapshots with a sequence number of at least `since` (and those the
/// table names: current, refs); also returns how many were dropped (0: the whole file was parsed) and what the next
/// call can reuse ([`Memo`]; `None` when the walk did not understand the file). `memo`: what the call on the
/// previous metadata file of the same table returned (`None` as well when the file lists its snapshots out of
/// commit order). See the module header.
pub(crate) fn parse_recent(bytes: &[u8], since: i64, memo: Option<&Memo>) -> serde_json::Result<(TableMetadata, usize, Option<Memo>)> {
    match trimmed(bytes, since, memo) {
        Some(t) if t.dropped > 0 => Ok((serde_json::from_slice(&t.doc)?, t.dropped, t.memo)),
        t => Ok((serde_json::from_slice(bytes)?, 0, t.and_then(|t| t.memo))),
    }
}

/// Whether every one of `recorded` (snapshot ids) is an ancestor of the current snapshot in `meta` (metadata with
/// snapshots dropped): then every range from one of them to a later snapshot of the main branch is there in full.
pub(crate) fn holds_lineage(meta: &TableMetadata, recorded: &[Option<i64>]) -> bool {
    recorded.iter().all(|r| match (r, meta.current_snapshot_id()) {
        (Some(r), Some(head)) => super::lineage::is_ancestor(meta, *r, head),
        _ => false,
    })
}

/// What the walk of one metadata file leaves for the walk of the table's next one: its `snapshots` and
/// `snapshot-log` arrays as far as they went, known by length and hash, and the elements it kept. A writer appends to
/// both arrays, so the next file's arrays start with the same bytes, and the walk resumes where this one ended. Small:
/// the kept (recent) elements only.
#[derive(Debug, Clone)]
pub(crate) struct Memo {
    /// The `since` of the walk: a later walk from an older sequence number would need what this one dropped.
    since: i64,
    snapshots: Prefix,
    log: Prefix,
}

/// An array's bytes from its `[` to the end of its last element (`len`, `hash`: [`chained`] over the pieces ending
/// at `cuts`), how many of its elements were dropped and the kept ones (ranges from the `[`).
#[derive(Debug, Clone, Default)]
struct Prefix {
    len: usize,
    hash: u64,
    /// Where each piece the hash was chained over ends (the last is `len`).
    cuts: Vec<usize>,
    dropped: usize,
    kept: Vec<Element>,
}

/// Pieces beyond which a prefix is hashed again as one (the chain's cost per piece stays small beside the bytes).
const MAX_PIECES: usize = 64;

/// An element of `snapshots` (snapshot id, sequence number) or of `snapshot-log` (snapshot id, 0, None) and its range.
#[derive(Debug, Clone)]
struct Element {
    id: i64,
    seq: i64,
    range: Range<usize>,
}

/// The hash of piece `bytes` of an array's prefix, chained to the hash `before` of the pieces before it (0 for the
/// first): keyed per process, so no file can be written to collide with another.
fn chain(before: u64, bytes: &[u8]) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static KEY: OnceLock<ahash::RandomState> = OnceLock::new();
    let mut h = KEY.get_or_init(ahash::RandomState::new).build_hasher();
    h.write_u64(before);
    h.write(bytes);
    h.finish()
}

/// The hash of `bytes` cut into pieces ending at `cuts` ([`chain`]ed), or `None` when a cut lies beyond them.
fn chained(bytes: &[u8], cuts: &[usize]) -> Option<u64> {
    let mut from = 0;
    let mut hash = 0;
    for &to in cuts {
        hash = chain(hash, bytes.get(from..to)?);
        from = to;
    }
    Some(hash)
}

/// What [`trimmed`] makes of a metadata file.
struct Trimmed {
    /// The document without the dropped snapshots and their log entries (empty when none was dropped).
    doc: Vec<u8>,
    dropped: usize,
    /// `None` when the snapshots are not in commit order.
    memo: Option<Memo>,
}

/// The document without the snapshots older than `since` and their log entries, how many were dropped, and the
/// memo for the next file; `None` when the walk does not understand the document. With a `memo` of the table's
/// previous file the result is the same as without, only cheaper.
fn trimmed(b: &[u8], since: i64, memo: Option<&Memo>) -> Option<Trimmed> {
    let memo = memo.filter(|m| m.since <= since);
    let (mut snapshots, mut log) = (None, None);
    let mut members = Vec::new();
    self::members(b, 0, |k, at| {
        let v = match &b[k.clone()] {
            b"snapshots" => {
                let a = walk_array(b, at, memo.map(|m| &m.snapshots), |e| {
                    let [id, seq] = fields(b, e, ["snapshot-id", "sequence-number"])?;
                    // v1: no sequence numbers, nothing to trim by
                    Some((number(b, id?)?, seq.map_or(Some(0), |v| number(b, v))?))
                })?;
                let v = a.range.clone();
                snapshots = Some(a);
                v
            }
            b"snapshot-log" => {
                let a = walk_array(b, at, memo.map(|m| &m.log), |e| {
                    let [id] = fields(b, e, ["snapshot-id"])?;
                    Some((number(b, id?)?, 0))
                })?;
                let v = a.range.clone();
                log = Some(a);
                v
            }
            _ => value(b, at)?,
        };
        members.push((k, v.clone()));
        Some((v, Walk::On))
    })?;
    let member = |name: &str| members.iter().find(|(k, _)| &b[k.clone()] == name.as_bytes()).map(|(_, v)| v.clone());
    let snapshots = snapshots?;
    // the snapshots the table names must stay (iceberg-rust checks them)
    let mut named: HashSet<i64> = member("current-snapshot-id").and_then(|v| number(b, v)).into_iter().collect();
    if let Some(refs) = member("refs") {
        let mut ids = Vec::new();
        self::members(b, refs.start, |_, at| {
            let r = value(b, at)?;
            let [id] = fields(b, r.clone(), ["snapshot-id"])?;
            ids.push(number(b, id?)?);
            Some((r, Walk::On))
        })?;
        named.extend(ids);
    }
    let kept: Vec<&Element> = snapshots.elements.iter().filter(|e| e.seq >= since || named.contains(&e.id)).collect();
    let kept_ids: HashSet<i64> = kept.iter().map(|e| e.id).collect();
    if memo.is_some() && named.iter().any(|id| !kept_ids.contains(id)) {
        // a snapshot named now may be one the last walk dropped: walk everything
        return trimmed(b, since, None);
    }
    let dropped = snapshots.dropped + snapshots.elements.len() - kept.len();
    let log_kept: Vec<&Element> = log.as_ref().map(|l| l.elements.iter().filter(|e| kept_ids.contains(&e.id)).collect()).unwrap_or_default();
    // a writer that appends lists its snapshots in commit order; one that does not (iceberg-rust writes them in a
    // hash map's order) gets no memo: its next file would not start the same, and hashing would be wasted
    let appends = snapshots.elements.windows(2).all(|w| w[0].seq <= w[1].seq);
    let memo =
        appends.then(|| Memo { since, snapshots: snapshots.prefix(b, &kept), log: log.as_ref().map(|l| l.prefix(b, &log_kept)).unwrap_or_default() });
    if dropped == 0 {
        return Some(Trimmed { doc: Vec::new(), dropped, memo });
    }
    let kept_len = |es: &[&Element]| es.iter().map(|e| e.range.len() + 1).sum::<usize>();
    let log_len = log.as_ref().map_or(0, |l| l.range.len());
    let mut out = Vec::with_capacity(b.len() - snapshots.range.len() - log_len + kept_len(&kept) + kept_len(&log_kept) + 4);
    out.push(b'{');
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(&b[k.clone()]);
        out.extend_from_slice(b"\":");
        match &b[k.clone()] {
            b"snapshots" => join(&mut out, b, &kept),
            b"snapshot-log" if log.is_some() => join(&mut out, b, &log_kept),
            _ => out.extend_from_slice(&b[v.clone()]),
        }
    }
    out.push(b'}');
    Some(Trimmed { doc: out, dropped, memo })
}

/// An array as [`walk_array`] found it.
struct Walked {
    /// The array's range, brackets included.
    range: Range<usize>,
    /// The elements of the prefix an earlier walk kept, then every later element.
    elements: Vec<Element>,
    /// How many elements of the prefix an earlier walk dropped.
    dropped: usize,
    /// Where the last element ends (the array's start when it is empty).
    last_end: usize,
    /// The hash and cuts of the prefix the walk resumed after (see [`Prefix`]), to chain on from.
    resumed: Option<(u64, Vec<usize>)>,
}

impl Walked {
    /// The prefix a next walk can skip: the whole array but its `]`, with `kept` of its elements.
    fn prefix(&self, b: &[u8], kept: &[&Element]) -> Prefix {
        let start = self.range.start;
        if self.last_end == start {
            return Prefix::default();
        }
        let len = self.last_end - start;
        let (hash, cuts) = match &self.resumed {
            Some((hash, cuts)) if cuts.last() == Some(&len) => (*hash, cuts.clone()),
            Some((hash, cuts)) if cuts.len() < MAX_PIECES => {
                let from = cuts.last().copied().unwrap_or(0);
                (chain(*hash, &b[start + from..self.last_end]), cuts.iter().copied().chain([len]).collect())
            }
            _ => (chain(0, &b[start..self.last_end]), vec![len]),
        };
        Prefix {
            len,
            hash,
            cuts,
            dropped: self.dropped + self.elements.len() - kept.len(),
            kept: kept.iter().map(|e| Element { id: e.id, seq: e.seq, range: e.range.start - start..e.range.end - start }).collect(),
        }
    }
}

/// The array starting at or after `at`, each element with what `ids` reads of it. When the array starts with the
/// bytes of `prior` (the same array in the table's previous metadata file), those are not walked: `prior`'s kept
/// elements stand for them.
fn walk_array(b: &[u8], at: usize, prior: Option<&Prefix>, ids: impl Fn(Range<usize>) -> Option<(i64, i64)>) -> Option<Walked> {
    let start = skip_ws(b, at);
    if b.get(start) != Some(&b'[') {
        return None;
    }
    let mut walked = Walked { range: start..start, elements: Vec::new(), dropped: 0, last_end: start, resumed: None };
    let mut from = start + 1;
    if let Some(p) = prior.filter(|p| p.len > 0 && b.len() > start + p.len && chained(&b[start..start + p.len], &p.cuts) == Some(p.hash)) {
        walked.resumed = Some((p.hash, p.cuts.clone()));
        walked.elements.extend(p.kept.iter().map(|e| Element { id: e.id, seq: e.seq, range: start + e.range.start..start + e.range.end }));
        walked.dropped = p.dropped;
        walked.last_end = start + p.len;
        let j = skip_ws(b, walked.last_end);
        match *b.get(j)? {
            b',' => from = j + 1,
            b']' => {
                walked.range = start..j + 1;
                return Some(walked);
            }
            _ => return None,
        }
    }
    let (found, end) = elements(b, from)?;
    if found.is_empty() && from > start + 1 {
        return None; // a comma before the `]`
    }
    for v in found {
        let (id, seq) = ids(v.clone())?;
        walked.last_end = v.end;
        walked.elements.push(Element { id, seq, range: v });
    }
    walked.range = start..end;
    Some(walked)
}

/// Appends `[e1,e2,…]` of `elements` (ranges of `b`) to `out`.
fn join(out: &mut Vec<u8>, b: &[u8], elements: &[&Element]) {
    out.push(b'[');
    for (i, e) in elements.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&b[e.range.clone()]);
    }
    out.push(b']');
}

/// The values of members `names` of the object at `value` (`None` inside: no such member), in one walk; `None`
/// when it is not an object the walk understands. Writers put a snapshot's ids first, as compact numbers: those are
/// read by [`compact_fields`], anything else member by member.
fn fields<const N: usize>(b: &[u8], value: Range<usize>, names: [&str; N]) -> Option<[Option<Range<usize>>; N]> {
    compact_fields(b, value.start, names).or_else(|| fields_by_members(b, value, names))
}

/// [`fields`] when every name is found among the object's leading members written compactly with integer values
/// (`{"snapshot-id":1,"sequence-number":2,…`: no whitespace, no escape in a key, each number followed by `,` or
/// `}`); `None` — the member walk decides — as soon as anything else comes first. Where it answers, it answers as
/// [`fields_by_members`] would: the same members in the same order, a repeated name's later value kept.
fn compact_fields<const N: usize>(b: &[u8], start: usize, names: [&str; N]) -> Option<[Option<Range<usize>>; N]> {
    let mut out = [const { None }; N];
    let mut found = 0;
    let mut j = start;
    if b.get(j) != Some(&b'{') {
        return None;
    }
    loop {
        if b.get(j + 1) != Some(&b'"') {
            return None;
        }
        let key = j + 2..j + 2 + b.get(j + 2..)?.iter().take(64).position(|c| matches!(c, b'"' | b'\\'))?;
        if b[key.end] != b'"' || b.get(key.end + 1) != Some(&b':') {
            return None;
        }
        let v = key.end + 2;
        let v = v..v + b.get(v..)?.iter().position(|c| !matches!(c, b'0'..=b'9' | b'-'))?;
        if v.is_empty() || !matches!(b[v.end], b',' | b'}') {
            return None;
        }
        if let Some(i) = names.iter().position(|n| n.as_bytes() == &b[key.clone()]) {
            found += usize::from(out[i].is_none());
            out[i] = Some(v.clone());
        }
        if found == N {
            return Some(out);
        }
        if b[v.end] != b',' {
            return None;
        }
        j = v.end;
    }
}

/// [`fields`] member by member.
fn fields_by_members<const N: usize>(b: &[u8], value: Range<usize>, names: [&str; N]) -> Option<[Option<Range<usize>>; N]> {
    let mut out = [const { None }; N];
    let mut found = 0;
    // stops at the last name found: the rest of a snapshot (its summary) is not walked again — the array's walk
    // already found where it ends (writers put the ids first)
    members(b, value.start, |k, at| {
        let v = self::value(b, at)?;
        if let Some(i) = names.iter().position(|n| n.as_bytes() == &b[k.clone()]) {
            found += usize::from(out[i].is_none());
            out[i] = Some(v.clone());
        }
        Some((v, if found == N { Walk::Stop } else { Walk::On }))
    })?;
    Some(out)
}

/// The integer at `value` (JSON's digits, an optional minus; `None` for anything else or beyond `i64`).
fn number(b: &[u8], value: Range<usize>) -> Option<i64> {
    let (negative, digits) = match &b[value] {
        [b'-', rest @ ..] => (true, rest),
        all => (false, all),
    };
    if digits.is_empty() {
        return None;
    }
    // accumulated negatively: i64::MIN has no positive counterpart
    let mut n = 0i64;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub(i64::from(c - b'0'))?;
    }
    if negative {
        Some(n)
    } else {
        n.checked_neg()
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The end (exclusive) of the string whose opening quote is at `i`.
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        if b[i] == b'"' {
            return Some(i + 1);
        }
        i += 2;
    }
}

/// Where a bracket walk stands between two bytes: whether inside a string, and whether the byte before was a
/// backslash inside one.
#[derive(Default)]
struct Brackets {
    in_string: bool,
    escaped: bool,
}

impl Brackets {
    /// The brackets outside strings among `chunk`'s bytes (at most 64) as bit masks (bit k: byte k): opening, closing.
    /// A block of 64 bytes without a backslash (and not after one) is read as masks: inside a string are the bytes
    /// after an odd number of quotes (a prefix XOR of the quote mask, carried from block to block). Anything else is
    /// walked byte by byte (escaped quotes).
    fn masks(&mut self, chunk: &[u8]) -> (u64, u64) {
        if let Ok(block) = <&[u8; 64]>::try_from(chunk) {
            let m = Masks::of(block);
            if m.backslash == 0 && !self.escaped {
                let mut inside = m.quote;
                for shift in [1, 2, 4, 8, 16, 32] {
                    inside ^= inside << shift;
                }
                if self.in_string {
                    inside = !inside;
                }
                self.in_string = inside >> 63 == 1;
                return (m.open & !inside, m.close & !inside);
            }
        }
        self.masks_by_bytes(chunk)
    }

    /// [`Self::masks`] byte by byte.
    fn masks_by_bytes(&mut self, chunk: &[u8]) -> (u64, u64) {
        let (mut open, mut close) = (0u64, 0u64);
        for (k, &c) in chunk.iter().enumerate() {
            if self.in_string {
                match c {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                b'"' => self.in_string = true,
                b'{' | b'[' => open |= 1 << k,
                b'}' | b']' => close |= 1 << k,
                _ => {}
            }
        }
        (open, close)
    }
}

/// Calls `each` with every bracket outside strings from `from` on, in order: its offset and whether it opens, until
/// `each` says stop (`Some(true)`) or gives up (`None`, returned); 64 bytes at a time ([`Brackets::masks`]).
/// `Some(false)`: the bytes ran out first.
fn brackets(b: &[u8], from: usize, mut each: impl FnMut(usize, bool) -> Option<bool>) -> Option<bool> {
    let mut walk = Brackets::default();
    let mut i = from;
    while i < b.len() {
        let chunk = &b[i..(i + 64).min(b.len())];
        let (open, close) = walk.masks(chunk);
        let mut events = open | close;
        while events != 0 {
            let k = events.trailing_zeros();
            if each(i + k as usize, open >> k & 1 == 1)? {
                return Some(true);
            }
            events &= events - 1;
        }
        i += chunk.len();
    }
    Some(false)
}

/// The positions of quotes, backslashes, opening and closing brackets in a block of 64 bytes.
struct Masks {
    quote: u64,
    backslash: u64,
    open: u64,
    close: u64,
}

impl Masks {
    #[cfg(target_arch = "x86_64")]
    fn of(block: &[u8; 64]) -> Masks {
        use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8};
        let mut m = Masks { quote: 0, backslash: 0, open: 0, close: 0 };
        // SAFETY: SSE2 is part of every x86_64 target; each load reads 16 of the block's 64 bytes (unaligned).
        unsafe {
            for k in 0..4 {
                let v = _mm_loadu_si128(block.as_ptr().add(16 * k).cast::<__m128i>());
                let eq = |v: __m128i, c: u8| u64::from(_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(c as i8))) as u16) << (16 * k);
                // '[' and '{' (and ']' and '}') differ in bit 0x20 alone: one compare finds both
                let folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
                m.quote |= eq(v, b'"');
                m.backslash |= eq(v, b'\\');
                m.open |= eq(folded, b'{');
                m.close |= eq(folded, b'}');
            }
        }
        m
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn of(block: &[u8; 64]) -> Masks {
        let mut m = Masks { quote: 0, backslash: 0, open: 0, close: 0 };
        for (k, &c) in block.iter().enumerate() {
            let bit = 1u64 << k;
            match c {
                b'"' => m.quote |= bit,
                b'\\' => m.backslash |= bit,
                b'{' | b'[' => m.open |= bit,
                b'}' | b']' => m.close |= bit,
                _ => {}
            }
        }
        m
    }
}

/// The end (exclusive) of the object or array whose opening bracket is at `start` ([`brackets`]).
fn container_end(b: &[u8], start: usize) -> Option<usize> {
    let (mut depth, mut end) = (0usize, None);
    brackets(b, start, |at, open| {
        if open {
            depth += 1;
        } else {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                end = Some(at + 1);
                return Some(true);
            }
        }
        Some(false)
    })?;
    end
}

/// The elements of an array, from `from` (just inside its `[`, or past the comma after an element) to its `]`, in
/// one bracket walk ([`brackets`]): each element's range and where the array ends (past its `]`). `None` when an
/// element is not an object or array, what lies between two is not a comma, or the array does not end.
fn elements(b: &[u8], from: usize) -> Option<(Vec<Range<usize>>, usize)> {
    // only whitespace in `gap`, around a comma when `comma`
    let gap = |gap: Range<usize>, comma: bool| {
        let g = &b[gap];
        let ws = |c: &u8| matches!(c, b' ' | b'\t' | b'\n' | b'\r');
        match g.iter().position(|c| !ws(c)) {
            None => !comma,
            Some(k) => comma && g[k] == b',' && g[k + 1..].iter().all(ws),
        }
    };
    let mut out = Vec::new();
    let (mut depth, mut start, mut after, mut end) = (1usize, from, from, None);
    brackets(b, from, |at, open| {
        if open {
            depth += 1;
            if depth == 2 {
                if !gap(after..at, !out.is_empty()) {
                    return None;
                }
                start = at;
            }
        } else {
            depth = depth.checked_sub(1)?;
            if depth == 1 {
                out.push(start..at + 1);
                after = at + 1;
            } else if depth == 0 {
                if !gap(after..at, false) {
                    return None;
                }
                end = Some(at + 1);
                return Some(true);
            }
        }
        Some(false)
    })?;
    Some((out, end?))
}

/// The range of the value starting at or after `i` (whitespace skipped): brackets and strings are followed, scalars
/// run to the next delimiter. Nothing is decoded.
fn value(b: &[u8], i: usize) -> Option<Range<usize>> {
    let start = skip_ws(b, i);
    match *b.get(start)? {
        b'"' => Some(start..string_end(b, start)?),
        b'{' | b'[' => Some(start..container_end(b, start)?),
        _ => {
            let end = b[start..].iter().position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')).map_or(b.len(), |n| start + n);
            (end > start).then_some(start..end)
        }
    }
}

/// Whether [`members`] goes on to the next member.
#[derive(PartialEq)]
enum Walk {
    On,
    Stop,
}

/// Calls `each` with every member of the object starting at or after `i`, in order, until it says stop: with the
/// key's range and where its value starts; `each` walks the value and returns its range (`None`: not understood).
fn members(b: &[u8], i: usize, mut each: impl FnMut(Range<usize>, usize) -> Option<(Range<usize>, Walk)>) -> Option<()> {
    let mut j = skip_ws(b, i);
    if b.get(j) != Some(&b'{') {
        return None;
    }
    j = skip_ws(b, j + 1);
    if b.get(j) == Some(&b'}') {
        return Some(());
    }
    loop {
        if b.get(j) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(b, j)?;
        let key = j + 1..key_end - 1;
        if b[key.clone()].contains(&b'\\') {
            return None;
        }
        j = skip_ws(b, key_end);
        if b.get(j) != Some(&b':') {
            return None;
        }
        let (v, walk) = each(key, j + 1)?;
        j = skip_ws(b, v.end);
        if walk == Walk::Stop {
            return Some(());
        }
        match b.get(j)? {
            b',' => j = skip_ws(b, j + 1),
            b'}' => return Some(()),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The members of the object starting at or after `i`: each key's range (inside the quotes) and its value's.
    /// `None` when it is not an object or a key has an escape.
    fn object_members(b: &[u8], i: usize) -> Option<Vec<(Range<usize>, Range<usize>)>> {
        let mut out = Vec::new();
        members(b, i, |k, at| {
            let v = value(b, at)?;
            out.push((k, v.clone()));
            Some((v, Walk::On))
        })?;
        Some(out)
    }

    /// How many elements the array at `i` has.
    fn array_len(b: &[u8], i: usize) -> Option<usize> {
        Some(walk_array(b, i, None, |_| Some((0, 0)))?.elements.len())
    }

    /// A v2 metadata document of `n` snapshots (sequence numbers 1..=n, each the parent of the next), a tag on the
    /// first, `main` at the last.
    pub(crate) fn history(n: i64) -> String {
        let snaps: Vec<String> = (1..=n)
            .map(|i| {
                let parent = if i > 1 { format!("\"parent-snapshot-id\": {},", 1000 + i - 1) } else { String::new() };
                format!(
                    r#"{{"snapshot-id": {id}, {parent} "sequence-number": {i}, "timestamp-ms": {ts}, "manifest-list": "s3://b/t/metadata/snap-{id}.avro", "summary": {{"operation": "append", "added-data-files": "1", "note": "has \"quotes\", ] and }} in it"}}, "schema-id": 0}}"#,
                    id = 1000 + i,
                    ts = 1_700_000_000_000 + i * 1000
                )
            })
            .collect();
        let log: Vec<String> =
            (1..=n).map(|i| format!(r#"{{"snapshot-id": {}, "timestamp-ms": {}}}"#, 1000 + i, 1_700_000_000_000 + i * 1000)).collect();
        format!(
            r#"{{
  "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1", "location": "s3://b/t",
  "last-sequence-number": {n}, "last-updated-ms": {last}, "last-column-id": 1,
  "current-schema-id": 0, "schemas": [{{"type": "struct", "schema-id": 0, "fields": [{{"id": 1, "name": "id", "required": true, "type": "long"}}]}}],
  "default-spec-id": 0, "partition-specs": [{{"spec-id": 0, "fields": []}}], "last-partition-id": 999,
  "default-sort-order-id": 0, "sort-orders": [{{"order-id": 0, "fields": []}}],
  "properties": {{"owner": "x"}},
  "current-snapshot-id": {cur},
  "refs": {{"main": {{"snapshot-id": {cur}, "type": "branch"}}, "first": {{"snapshot-id": 1001, "type": "tag"}}}},
  "snapshots": [{snaps}],
  "snapshot-log": [{log}],
  "metadata-log": []
}}"#,
            last = 1_700_000_000_000 + n * 1000 + 1,
            cur = 1000 + n,
            snaps = snaps.join(",\n"),
            log = log.join(", ")
        )
    }

    #[test]
    fn keeps_the_recent_snapshots_and_those_the_table_names_and_nothing_else_changes() {
        let doc = history(50);
        let full: TableMetadata = serde_json::from_str(&doc).unwrap();
        let (meta, dropped, _) = parse_recent(doc.as_bytes(), 45, None).unwrap();
        let ids = |m: &TableMetadata| {
            let mut v: Vec<i64> = m.snapshots().map(|s| s.snapshot_id()).collect();
            v.sort();
            v
        };
        assert_eq!(ids(&meta), vec![1001, 1045, 1046, 1047, 1048, 1049, 1050], "seq ≥ 45, plus the tagged first");
        assert_eq!(dropped, 43);
        for id in ids(&meta) {
            assert_eq!(meta.snapshot_by_id(id), full.snapshot_by_id(id), "a kept snapshot is as the full parse has it");
        }
        assert_eq!(meta.history().iter().map(|e| e.snapshot_id).collect::<Vec<_>>(), ids(&meta));
        assert_eq!(
            (meta.uuid(), meta.current_snapshot_id(), meta.last_sequence_number(), meta.properties()),
            (full.uuid(), full.current_snapshot_id(), full.last_sequence_number(), full.properties())
        );
        assert_eq!(meta.current_schema(), full.current_schema());
        // lineage from a kept snapshot is whole; from a dropped one it is not there to judge
        assert!(holds_lineage(&meta, &[Some(1045), Some(1050)]));
        assert!(!holds_lineage(&meta, &[Some(1044)]), "dropped");
        assert!(!holds_lineage(&meta, &[Some(1001)]), "kept, but its lineage to the head is not");
        assert!(!holds_lineage(&meta, &[None]));
    }

    #[test]
    fn parses_everything_when_nothing_is_old_enough_or_the_walk_does_not_understand() {
        let doc = history(5);
        assert_eq!(parse_recent(doc.as_bytes(), 1, None).unwrap().1, 0);
        assert_eq!(parse_recent(doc.as_bytes(), 1, None).unwrap().0.snapshots().count(), 5);
        // an escaped key: no trimming, the parser decides
        let escaped = doc.replacen("\"properties\"", "\"prop\\u0065rties\"", 1);
        assert_eq!(parse_recent(escaped.as_bytes(), 4, None).unwrap().1, 0);
        // a damaged file is the parser's error, as before
        assert!(parse_recent(&doc.as_bytes()[..doc.len() / 2], 4, None).is_err());
        assert!(parse_recent(b"[1, 2]", 4, None).is_err());
    }

    /// The trimmed document, the number dropped and the memo of `doc` (which the walk must understand).
    fn trim(doc: &str, since: i64, memo: Option<&Memo>) -> (Vec<u8>, usize, Memo) {
        let t = trimmed(doc.as_bytes(), since, memo).expect("understood");
        (t.doc, t.dropped, t.memo.expect("in commit order"))
    }

    #[test]
    fn a_walk_that_resumes_where_the_last_file_ended_trims_as_a_whole_walk_does() {
        let mut memo = None;
        let mut since = 1;
        let mut chained_on = 0;
        for n in 10..80 {
            // the sinks move on unevenly; every file is walked with the memo of the one before
            since = (since + n % 3).min(n);
            let doc = history(n);
            let (whole, dropped, _) = trim(&doc, since, None);
            let (resumed, resumed_dropped, next) = trim(&doc, since, memo.as_ref());
            assert_eq!((String::from_utf8_lossy(&resumed), resumed_dropped), (String::from_utf8_lossy(&whole), dropped), "n = {n}");
            assert!(next.snapshots.kept.len() <= (n - since + 2) as usize, "the memo holds the kept snapshots only");
            // the hash went on from the last memo's (each byte hashed once), up to MAX_PIECES pieces
            assert!((1..=MAX_PIECES).contains(&next.snapshots.cuts.len()) && next.snapshots.cuts.last() == Some(&next.snapshots.len));
            chained_on += usize::from(next.snapshots.cuts.len() > 1);
            memo = Some(next);
        }
        assert!(chained_on > 60, "{chained_on} walks went on from the memo before them");
        let memo = memo.unwrap();
        // the memo is what the walk went by: one whose kept elements were lost loses them from the result
        let doc = history(80);
        let mut forgetful = memo.clone();
        forgetful.snapshots.kept.retain(|e| e.id == 1001); // the tagged one stays: a named snapshot missing means a whole walk
        assert_ne!(trim(&doc, memo.since, Some(&forgetful)).0, trim(&doc, memo.since, None).0);
        // ... and it is not used where it cannot hold: a walk from an older sequence number, or a file whose arrays
        // no longer start as the last one's did (old snapshots expired), or a snapshot named now that the last walk
        // dropped
        assert_eq!(trim(&doc, memo.since - 5, Some(&memo)).0, trim(&doc, memo.since - 5, None).0);
        let expired = doc.replacen(r#""snapshot-id": 1002, "parent-snapshot-id": 1001,"#, r#""snapshot-id": 1002,"#, 1);
        assert_eq!(trim(&expired, memo.since, Some(&memo)).0, trim(&expired, memo.since, None).0);
        let tagged = doc.replacen(r#""first": {"snapshot-id": 1001"#, r#""first": {"snapshot-id": 1003"#, 1);
        let (doc_tagged, ..) = trim(&tagged, memo.since, Some(&memo));
        assert_eq!(doc_tagged, trim(&tagged, memo.since, None).0);
        let meta: TableMetadata = serde_json::from_slice(&doc_tagged).unwrap();
        assert!(meta.snapshot_by_id(1003).is_some(), "the newly tagged snapshot is kept");
        // snapshots out of commit order (iceberg-rust writes a hash map's order): trimmed, but no memo
        let unordered = history(20).replacen(r#""sequence-number": 2,"#, r#""sequence-number": 9,"#, 1);
        let t = trimmed(unordered.as_bytes(), 15, None).unwrap();
        assert!(t.dropped > 0 && t.memo.is_none());
    }

    #[test]
    fn the_walk_follows_strings_and_nesting() {
        let b = br#" { "a" : [1, {"x": "]}\"\\"}], "b":-3.5e2 , "c": {} ,"d":[] } "#;
        let m = object_members(b, 0).unwrap();
        let keys: Vec<&[u8]> = m.iter().map(|(k, _)| &b[k.clone()]).collect();
        assert_eq!(keys, vec![&b"a"[..], b"b", b"c", b"d"]);
        assert_eq!(&b[m[0].1.clone()], br#"[1, {"x": "]}\"\\"}]"#);
        assert_eq!(&b[m[1].1.clone()], b"-3.5e2");
        assert_eq!(array_len(b, m[0].1.start), None, "the arrays walked hold objects: a scalar element is not understood");
        assert_eq!(array_len(br#"[{"x": "]}\"\\"}, [1, "["]]"#, 0), Some(2));
        assert_eq!(array_len(b, m[3].1.start), Some(0));
        assert!(object_members(br#"{"a": [1, 2}"#, 0).is_none(), "unbalanced");
        assert!(object_members(br#"{"a": "open}"#, 0).is_none(), "unterminated string");
    }

    /// A random JSON value of nesting `depth` from `rng` (an xorshift state): strings full of brackets, quotes and
    /// backslashes escaped as JSON escapes them, long runs of plain bytes, so that block edges fall anywhere.
    fn random_value(rng: &mut u64, depth: u32, out: &mut String) {
        let mut next = || {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            *rng
        };
        match next() % if depth == 0 { 2 } else { 4 } {
            0 => {
                out.push('"');
                for _ in 0..next() % 90 {
                    out.push_str(["a", "{", "}", "[", "]", "\\\"", "\\\\", " ", "xyz", "\\n"][(next() % 10) as usize]);
                }
                out.push('"');
            }
            1 => out.push_str(&(next() % 100_000).to_string()),
            2 => {
                out.push('[');
                let n = next() % 5;
                for i in 0..n {
                    if i > 0 {
                        out.push(',');
                    }
                    random_value(rng, depth - 1, out);
                }
                out.push(']');
            }
            _ => {
                out.push('{');
                let n = next() % 5;
                for i in 0..n {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&format!("\"k{i}\": "));
                    random_value(rng, depth - 1, out);
                }
                out.push('}');
            }
        }
    }

    #[test]
    fn the_block_walk_ends_a_container_where_the_byte_walk_does() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for case in 0..3000 {
            let mut v = String::new();
            while !v.starts_with(['{', '[']) {
                v.clear();
                random_value(&mut rng, 1 + case % 6, &mut v);
            }
            // at every alignment, with more bytes after it
            let pad = " ".repeat(case as usize % 64);
            let doc = format!("{pad}{v}, [\"]\"]");
            let start = pad.len();
            assert_eq!(container_end(doc.as_bytes(), start), Some(start + v.len()), "{doc}");
            // the masks of every block, as masks where they can be and byte by byte, agree
            let (mut fast, mut slow) = (Brackets::default(), Brackets::default());
            for chunk in doc.as_bytes()[start..].chunks(64) {
                assert_eq!(fast.masks(chunk), slow.masks_by_bytes(chunk), "{doc}");
                assert_eq!((fast.in_string, fast.escaped), (slow.in_string, slow.escaped), "{doc}");
            }
            // cut short: no end
            assert_eq!(container_end(&doc.as_bytes()[..start + v.len() - 1], start), None, "{doc}");
        }
        assert_eq!(container_end(b"{]}", 0), Some(2), "brackets are counted, not paired (the parser checks what is kept)");
        assert_eq!(container_end(b"]", 0), None);
    }

    #[test]
    fn the_one_pass_walk_finds_every_element_of_an_array_and_refuses_what_is_not_one() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for case in 0..1500 {
            // an array of random objects and arrays, at every alignment
            let mut items = Vec::new();
            for _ in 0..case % 9 {
                let mut v = String::new();
                while !v.starts_with(['{', '[']) {
                    v.clear();
                    random_value(&mut rng, 1 + case % 5, &mut v);
                }
                items.push(v);
            }
            let pad = " ".repeat(case as usize % 64);
            let sep = [",", " , ", ",\n  "][case as usize % 3];
            let doc = format!("{pad}[ {} ] , 1", items.join(sep));
            let (found, end) = elements(doc.as_bytes(), pad.len() + 1).expect(&doc);
            let found: Vec<&str> = found.iter().map(|r| &doc[r.clone()]).collect();
            assert_eq!(found, items, "{doc}");
            assert_eq!(&doc[end..], " , 1");
        }
        for bad in [r#"[{}, 1]"#, r#"[{} {}]"#, r#"["{}"]"#, r#"[{},,{}]"#, r#"[{}, ]"#, r#"[,{}]"#, r#"[{}"#, r#"[x{}]"#] {
            assert_eq!(elements(bad.as_bytes(), 1), None, "{bad}");
        }
        assert_eq!(elements(b"[ ]", 1), Some((Vec::new(), 3)));
        // resuming past a comma: an element must follow
        assert!(walk_array(b"[{}, ]", 0, None, |_| Some((0, 0))).is_none());
    }

    /// Random objects, compact and not: where the compact reading answers, it answers as the member walk does; a
    /// compact history is trimmed as the same history with whitespace is.
    #[test]
    fn the_compact_reading_of_ids_agrees_with_the_member_walk() {
        let mut rng = crate::test_rng::Rng(0x0bad_cafe_dead_beef);
        let mut next = |n: u64| rng.below(n);
        let mut answered = 0;
        for _ in 0..20_000 {
            let mut doc = String::from("{");
            for m in 0..next(5) {
                if m > 0 {
                    doc.push_str([",", ", ", ",", ","][next(4) as usize]);
                }
                let key =
                    ["snapshot-id", "sequence-number", "snapshot-id", "sequence-number", "parent-snapshot-id", "a\\\"b", "summary"][next(7) as usize];
                let value = ["1", "-22", "12", "0", "1.5", "3e2", "\"s\"", "{}", "99999999999999999999", "-", "7 "][next(11) as usize];
                doc.push_str(&format!("\"{key}\":{value}"));
            }
            doc.push_str(["}", "", "}  ", "}"][next(4) as usize]);
            let b = doc.as_bytes();
            let names = ["snapshot-id", "sequence-number"];
            if let Some(compact) = compact_fields(b, 0, names) {
                answered += 1;
                assert_eq!(Some(compact), fields_by_members(b, 0..b.len(), names), "{doc}");
            }
            assert_eq!(fields(b, 0..b.len(), names), fields_by_members(b, 0..b.len(), names), "{doc}");
        }
        assert!(answered > 300, "the compact reading answered {answered} times");
        let spaced = history(60);
        let compact = spaced.replace(": ", ":").replace(", \"", ",\"");
        assert!(compact.contains(r#"{"snapshot-id":1002,"parent-snapshot-id":1001,"sequence-number":2,"#));
        let (a, b) = (parse_recent(spaced.as_bytes(), 40, None).unwrap(), parse_recent(compact.as_bytes(), 40, None).unwrap());
        assert_eq!((a.0, a.1), (b.0, b.1));
        assert_eq!(a.1, 38, "snapshots 2–39 dropped (the first is tagged)");
    }

    #[test]
    fn numbers_are_json_integers() {
        let n = |s: &str| number(s.as_bytes(), 0..s.len());
        assert_eq!((n("0"), n("-0"), n("42"), n("-17")), (Some(0), Some(0), Some(42), Some(-17)));
        assert_eq!((n("9223372036854775807"), n("-9223372036854775808")), (Some(i64::MAX), Some(i64::MIN)));
        assert_eq!((n("9223372036854775808"), n("1.5"), n("1e3"), n("-"), n(""), n("+1")), (None, None, None, None, None, None));
    }

    /// Not a test of behaviour: prints what the full and the recent parse of a long history cost here.
    #[test]
    #[ignore]
    fn cost_of_a_long_history() {
        for n in [10, 3000, 10_000] {
            let doc = history(n);
            let t = std::time::Instant::now();
            for _ in 0..5 {
                let _: TableMetadata = serde_json::from_str(&doc).unwrap();
            }
            let full = t.elapsed() / 5;
            let t = std::time::Instant::now();
            for _ in 0..5 {
                parse_recent(doc.as_bytes(), n - 1, None).unwrap();
            }
            let recent = t.elapsed() / 5;
            // the next file of the table, walked with the memo of this one
            let (.., memo) = parse_recent(doc.as_bytes(), n - 1, None).unwrap();
            let next = history(n + 1);
            let t = std::time::Instant::now();
            for _ in 0..5 {
                parse_recent(next.as_bytes(), n - 1, memo.as_ref()).unwrap();
            }
            let resumed = t.elapsed() / 5;
            // as iceberg-rust writes it: no escapes (so blocks are read as masks), no memo (a hash map's order)
            let plain = doc.replace(r#", "note": "has \"quotes\", ] and } in it""#, "");
            let t = std::time::Instant::now();
            for _ in 0..5 {
                parse_recent(plain.as_bytes(), n - 1, None).unwrap();
            }
            let spaced = t.elapsed() / 5;
            // ... and compact, as serde_json writes it
            let compact = plain.replace(": ", ":").replace(", \"", ",\"");
            let t = std::time::Instant::now();
            for _ in 0..5 {
                parse_recent(compact.as_bytes(), n - 1, None).unwrap();
            }
            println!(
                "{n} snapshots, {} KB: full {full:?}, recent {recent:?}, recent resumed {resumed:?}; without escapes ({} KB): recent {spaced:?}, compact ({} KB) {:?}",
                doc.len() / 1024,
                plain.len() / 1024,
                compact.len() / 1024,
                t.elapsed() / 5
            );
        }
    }
}
