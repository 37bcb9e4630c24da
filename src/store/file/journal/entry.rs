//! The entries of a journal frame's payload: how one is encoded, and read back without
//! trusting a byte of it (a bad entry is an error naming its offset, never a panic).

use std::ops::Range;

use crate::idempotency::{Record, ScopeId, ScopedKey};

const PUT: u8 = 1;
const REMOVE: u8 = 2;
/// A put with the scope of its request (docs/behaviour.md §17), which
/// `store.max_entries_per_scope` counts records by: `PUT`'s layout with the 16-byte
/// scope after the key.
const PUT_SCOPED: u8 = 3;
const KEY_END: usize = 1 + 32;
const SCOPE_LEN: usize = 16;

/// One change as the journal stores it: a key's whole new state, or its removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::file) enum Entry<'a> {
    Put {
        key: ScopedKey,
        expires_ms: u64,
        record: &'a [u8],
        scope: Option<ScopeId>,
    },
    Remove {
        key: ScopedKey,
    },
}

/// Appends the encoding of `entry` to `buf`; the writer batches many into one frame.
pub(in crate::store::file) fn encode(entry: &Entry<'_>, buf: &mut Vec<u8>) {
    match *entry {
        Entry::Put {
            key,
            expires_ms,
            record,
            scope,
        } => {
            let record_len = u32::try_from(record.len())
                .expect("a record is far below 4 GiB: a body is kept only up to max_response_body");
            buf.reserve(KEY_END + SCOPE_LEN + 12 + record.len());
            put_head(buf, &key, scope.as_ref());
            buf.extend_from_slice(&expires_ms.to_be_bytes());
            buf.extend_from_slice(&record_len.to_be_bytes());
            buf.extend_from_slice(record);
        }
        Entry::Remove { key } => {
            buf.push(REMOVE);
            buf.extend_from_slice(key.as_bytes());
        }
    }
}

/// Appends a put of `record` under `key`, the record encoded straight into `buf`: the
/// same bytes as [`encode`] of its [`Record::encode`], without that copy first (this
/// runs under the key's shard lock, for every change).
pub(in crate::store::file) fn encode_put(
    key: &ScopedKey,
    expires_ms: u64,
    record: &Record,
    scope: Option<&ScopeId>,
    buf: &mut Vec<u8>,
) {
    put_head(buf, key, scope);
    buf.extend_from_slice(&expires_ms.to_be_bytes());
    let len_at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    record.encode_into(buf);
    let record_len = u32::try_from(buf.len() - len_at - 4)
        .expect("a record is far below 4 GiB: a body is kept only up to max_response_body");
    buf[len_at..len_at + 4].copy_from_slice(&record_len.to_be_bytes());
}

/// A put's tag, key and, when it has one, scope.
fn put_head(buf: &mut Vec<u8>, key: &ScopedKey, scope: Option<&ScopeId>) {
    buf.push(if scope.is_some() { PUT_SCOPED } else { PUT });
    buf.extend_from_slice(key.as_bytes());
    if let Some(scope) = scope {
        buf.extend_from_slice(scope.as_bytes());
    }
}

/// The entries of a payload in order, each with its byte range in the payload; an entry
/// that does not decode ends the walk with its offset and why.
pub(super) struct Entries<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Entries<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    fn decode(&self) -> Result<(Entry<'a>, usize), String> {
        let bytes = self.bytes.get(self.at..).unwrap_or_default();
        let truncated = |what: &str| format!("the entry ends inside its {what}");
        let tag = match bytes.first() {
            Some(&tag) if tag == PUT || tag == REMOVE || tag == PUT_SCOPED => tag,
            Some(tag) => return Err(format!("unknown entry tag {tag}")),
            None => return Err(truncated("tag")),
        };
        let key: [u8; 32] = bytes
            .get(1..KEY_END)
            .and_then(|k| k.try_into().ok())
            .ok_or_else(|| truncated("key"))?;
        let key = ScopedKey::from_bytes(key);
        match tag {
            REMOVE => Ok((Entry::Remove { key }, KEY_END)),
            _ => {
                let field = |range: Range<usize>| bytes.get(range).ok_or_else(|| truncated("head"));
                let (scope, at) = if tag == PUT_SCOPED {
                    let scope: [u8; SCOPE_LEN] = field(KEY_END..KEY_END + SCOPE_LEN)?
                        .try_into()
                        .map_err(|_| truncated("scope"))?;
                    (Some(ScopeId::from_bytes(scope)), KEY_END + SCOPE_LEN)
                } else {
                    (None, KEY_END)
                };
                let expires: [u8; 8] = field(at..at + 8)?
                    .try_into()
                    .map_err(|_| truncated("expiry"))?;
                let record_len: [u8; 4] = field(at + 8..at + 12)?
                    .try_into()
                    .map_err(|_| truncated("record length"))?;
                let head = at + 12;
                let end = usize::try_from(u32::from_be_bytes(record_len))
                    .ok()
                    .and_then(|len| head.checked_add(len))
                    .ok_or_else(|| truncated("record"))?;
                let record = bytes.get(head..end).ok_or_else(|| truncated("record"))?;
                let expires_ms = u64::from_be_bytes(expires);
                Ok((
                    Entry::Put {
                        key,
                        expires_ms,
                        record,
                        scope,
                    },
                    end,
                ))
            }
        }
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<(Range<usize>, Entry<'a>), (usize, String)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.bytes.len() {
            return None;
        }
        let start = self.at;
        match self.decode() {
            Ok((entry, len)) => {
                self.at = start + len;
                Some(Ok((start..self.at, entry)))
            }
            Err(reason) => {
                self.at = self.bytes.len();
                Some(Err((start, reason)))
            }
        }
    }
}
