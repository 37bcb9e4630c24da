//! The size and depth limits of a configuration (docs/behaviour.md §15), checked on the
//! text in one pass before the YAML parser sees it.
//!
//! A configuration is a few levels deep and a few kilobytes long, but the parser's time
//! grows with the square of the nesting of flow collections: libyaml's scanner walks
//! its stack of possible simple keys, one entry per open `[` or `{`, at every token, and
//! serde_yaml parses the whole document before its own recursion limit (128) can
//! refuse it. `upstream: [[[[...]]]]` 100 000 levels deep (200 KB) took 46 s of CPU to
//! be refused, `{a: {a: ...}}` 94 s (release build). Block nesting (`- - - x`, indentation) is linear
//! in the parser, and deep indentation needs a file as large as the square of its
//! depth, but the depth limit covers it too, so that a depth means the same in every
//! style.
//!
//! The depth is counted the way the parser will nest the document, by following the
//! scanner's own rules (libyaml's `scanner.c`, as vendored by `unsafe-libyaml`) for
//! where a token starts, what a quoted, plain or block scalar covers, and which
//! column opens a block collection, so that brackets inside strings, comments and
//! block scalars never count and nothing the parser will read as nesting is skipped.
//! Where the scanner would stop with an error, so does this count: the parser then
//! reports that error as usual.

use super::ConfigError;

mod scalars;

/// The largest configuration file, in bytes.
pub(super) const MAX_BYTES: usize = 1 << 20;

/// The deepest nesting of collections: a top-level mapping is 1, `a: [x]` is 2.
pub(super) const MAX_DEPTH: usize = 64;

/// Refuses text above [`MAX_BYTES`] (under `location`, the file or `(document)`).
pub(super) fn check_size(len: usize, location: &str) -> Result<(), ConfigError> {
    if len > MAX_BYTES {
        return Err(ConfigError::Limit {
            location: location.to_owned(),
            message: format!(
                "larger than 1 MiB ({MAX_BYTES} bytes), the most a configuration may hold"
            ),
        });
    }
    Ok(())
}

/// Refuses text nested deeper than [`MAX_DEPTH`], naming where the level too many opens.
pub(super) fn check_depth(text: &str) -> Result<(), ConfigError> {
    let mut scan = Scan::new(text.as_bytes(), MAX_DEPTH);
    match scan.run() {
        Ok(()) | Err(Halt::Unparsable) => Ok(()),
        Err(Halt::TooDeep(at)) => Err(ConfigError::Limit {
            location: format!("line {} column {}", at.line + 1, at.column + 1),
            message: format!("nested deeper than {MAX_DEPTH} levels"),
        }),
    }
}

/// How deep the parser will nest `text` (with no limit), and whether it reads it to
/// the end rather than stopping with an error.
#[cfg(test)]
pub(super) fn depth(text: &str) -> (usize, bool) {
    let mut scan = Scan::new(text.as_bytes(), usize::MAX);
    let read_to_end = scan.run().is_ok();
    (scan.deepest, read_to_end)
}

/// Why the scan ended before the end of the text.
#[derive(Debug, PartialEq, Eq)]
enum Halt {
    /// A collection opened at this mark is one level too many.
    TooDeep(Mark),
    /// The YAML scanner stops with an error here, so nothing after it is parsed.
    Unparsable,
}

/// A position as libyaml counts it: `at` in bytes, `column` in characters, from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    at: usize,
    line: usize,
    column: usize,
}

/// An open block collection and the column libyaml's indentation stack holds for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Mapping(usize),
    Sequence(usize),
    /// `key:` followed by `- item` at the key's own column: a sequence that takes no
    /// column of its own, and ends at the next token of that column that is not `-`.
    Indentless(usize),
}

impl Block {
    fn column(self) -> usize {
        match self {
            Block::Mapping(c) | Block::Sequence(c) | Block::Indentless(c) => c,
        }
    }
}

/// Where a simple key may have started, and the deepest level reached since: if the
/// key turns out to be one (a `:` follows), the mapping opened for it encloses all of
/// that too, although it opens only now.
#[derive(Debug, Clone, Copy)]
struct Key {
    mark: Mark,
    peak: usize,
}

#[derive(Debug)]
struct Flow {
    sequence: bool,
    /// `[a: b]`: a single-pair mapping is open in the current entry of a sequence.
    pair: bool,
    key: Option<Key>,
    /// The deepest level reached while this collection is open.
    peak: usize,
}

/// libyaml's scanner reduced to what decides the nesting.
struct Scan<'a> {
    text: &'a [u8],
    mark: Mark,
    blocks: Vec<Block>,
    flows: Vec<Flow>,
    /// Flow sequences in `flows` with a pair open, counted once more each.
    pairs: usize,
    /// Whether a simple key (or a block indicator) may start here.
    simple_key_allowed: bool,
    /// A simple key that may have started in the block context.
    block_key: Option<Key>,
    /// The depth past which the scan halts.
    limit: usize,
    /// The deepest level reached.
    deepest: usize,
    /// Whether `text` stops at a control character, where the reader fails.
    cut: bool,
}

impl<'a> Scan<'a> {
    fn new(text: &'a [u8], limit: usize) -> Self {
        // libyaml's reader refuses a control character, so nothing after one is parsed.
        let end = text
            .iter()
            .position(|&b| (b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r')) || b == 0x7F)
            .unwrap_or(text.len());
        let (text, cut) = (&text[..end], end < text.len());
        Scan {
            text,
            mark: Mark {
                at: 0,
                line: 0,
                column: 0,
            },
            blocks: Vec::new(),
            flows: Vec::new(),
            pairs: 0,
            simple_key_allowed: true,
            block_key: None,
            limit,
            deepest: 0,
            cut,
        }
    }

    /// `yaml_parser_fetch_next_token`, until the end of the text.
    fn run(&mut self) -> Result<(), Halt> {
        loop {
            self.skip_to_token();
            let Some(c) = self.byte(0) else {
                return if self.cut {
                    Err(Halt::Unparsable)
                } else {
                    Ok(())
                };
            };
            let column = self.mark.column;
            if self.flows.is_empty() {
                self.unroll(column, c == b'-' && self.blankz(1));
            }
            let flow = !self.flows.is_empty();
            if column == 0 && c == b'%' {
                // A directive: the rest of the line.
                self.unroll_all();
                self.remove_key();
                self.simple_key_allowed = false;
                self.skip_line();
            } else if column == 0 && self.document_marker() {
                self.unroll_all();
                self.remove_key();
                self.simple_key_allowed = false;
                for _ in 0..3 {
                    self.advance();
                }
            } else if c == b'[' || c == b'{' {
                self.save_key();
                self.flows.push(Flow {
                    sequence: c == b'[',
                    pair: false,
                    key: None,
                    peak: 0,
                });
                self.opened(0, self.mark)?;
                self.simple_key_allowed = true;
                self.advance();
            } else if c == b']' || c == b'}' {
                self.close_flow();
                self.simple_key_allowed = false;
                self.advance();
            } else if c == b',' {
                self.remove_key();
                self.close_pair();
                self.simple_key_allowed = true;
                self.advance();
            } else if c == b'-' && self.blankz(1) {
                if !flow {
                    self.roll(Block::Sequence(column), 0, self.mark)?;
                }
                self.remove_key();
                self.simple_key_allowed = true;
                self.advance();
            } else if c == b'?' && (flow || self.blankz(1)) {
                self.open_mapping(Block::Mapping(column), 0, self.mark)?;
                self.remove_key();
                self.simple_key_allowed = !flow;
                self.advance();
            } else if c == b':' && (flow || self.blankz(1)) {
                self.value()?;
                self.advance();
            } else if c == b'*' || c == b'&' {
                self.save_key();
                self.simple_key_allowed = false;
                self.advance();
                while self
                    .byte(0)
                    .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                {
                    self.advance();
                }
            } else if c == b'!' {
                self.save_key();
                self.simple_key_allowed = false;
                // A tag ends at a blank; in a flow collection also at an indicator
                // (libyaml refuses any other character after the tag's last one).
                while !(self.blankz(0) || (flow && self.flow_indicator(0))) {
                    self.advance();
                }
            } else if (c == b'|' || c == b'>') && !flow {
                self.remove_key();
                self.simple_key_allowed = true;
                self.block_scalar()?;
            } else if c == b'\'' || c == b'"' {
                self.save_key();
                self.simple_key_allowed = false;
                self.quoted(c)?;
            } else if self.plain_starts(c) {
                self.save_key();
                self.simple_key_allowed = false;
                self.plain()?;
            } else {
                // "found character that cannot start any token"
                return Err(Halt::Unparsable);
            }
        }
    }

    fn depth(&self) -> usize {
        self.blocks.len() + self.flows.len() + self.pairs
    }

    /// Called whenever a level opens: it is `depth()` deep, or one deeper than
    /// `enclosed`, the deepest level of a key it opens for.
    fn opened(&mut self, enclosed: usize, at: Mark) -> Result<(), Halt> {
        let depth = self.depth().max(enclosed + 1);
        self.deepest = self.deepest.max(depth);
        if let Some(flow) = self.flows.last_mut() {
            flow.peak = flow.peak.max(depth);
        }
        if depth > self.limit {
            Err(Halt::TooDeep(at))
        } else {
            Ok(())
        }
    }

    /// `]` or `}`: what the collection reached counts for the enclosing one and its key.
    fn close_flow(&mut self) {
        let Some(closed) = self.flows.pop() else {
            return;
        };
        self.pairs -= usize::from(closed.pair);
        let key = match self.flows.last_mut() {
            Some(parent) => {
                parent.peak = parent.peak.max(closed.peak);
                &mut parent.key
            }
            None => &mut self.block_key,
        };
        if let Some(key) = key {
            key.peak = key.peak.max(closed.peak);
        }
    }

    /// The column of the innermost block collection, as libyaml's `parser->indent`.
    fn indent(&self) -> Option<usize> {
        self.blocks.last().map(|b| b.column())
    }

    /// `yaml_parser_unroll_indent`: a token ends every block collection indented more
    /// than it, and an indentless sequence at its own column unless it is an entry.
    fn unroll(&mut self, column: usize, entry: bool) {
        while let Some(top) = self.blocks.last() {
            let ends = top.column() > column || (*top == Block::Indentless(column) && !entry);
            if !ends {
                break;
            }
            self.blocks.pop();
        }
    }

    /// `yaml_parser_unroll_indent(parser, -1)`, which a flow collection ignores.
    fn unroll_all(&mut self) {
        if self.flows.is_empty() {
            self.blocks.clear();
        }
    }

    /// `yaml_parser_roll_indent`: a block collection opens at a column deeper than the
    /// current one; a sequence also opens at a mapping's own column (indentless).
    fn roll(&mut self, block: Block, enclosed: usize, at: Mark) -> Result<(), Halt> {
        let column = block.column();
        let opens = match (self.blocks.last(), block) {
            (None, _) => Some(block),
            (Some(top), _) if top.column() < column => Some(block),
            (Some(Block::Mapping(c)), Block::Sequence(_)) if *c == column => {
                Some(Block::Indentless(column))
            }
            _ => None,
        };
        match opens {
            Some(block) => {
                self.blocks.push(block);
                self.opened(enclosed, at)
            }
            None => Ok(()),
        }
    }

    /// A key or value indicator: a block mapping in the block context, a single-pair
    /// mapping inside a flow sequence.
    fn open_mapping(&mut self, block: Block, enclosed: usize, at: Mark) -> Result<(), Halt> {
        let Some(flow) = self.flows.last_mut() else {
            return self.roll(block, enclosed, at);
        };
        if flow.sequence && !flow.pair {
            flow.pair = true;
            self.pairs += 1;
            self.opened(enclosed, at)?;
        }
        Ok(())
    }

    fn close_pair(&mut self) {
        if let Some(flow) = self.flows.last_mut()
            && flow.pair
        {
            flow.pair = false;
            self.pairs -= 1;
        }
    }

    /// `yaml_parser_fetch_value`: the mapping opens where the simple key started, if
    /// one is still possible (same line, within 1024 bytes), else at the `:`.
    fn value(&mut self) -> Result<(), Halt> {
        let now = self.mark;
        let key = self
            .key_slot()
            .take()
            .filter(|k| k.mark.line == now.line && k.mark.at + 1024 >= now.at);
        match key {
            Some(key) => {
                let block = Block::Mapping(key.mark.column);
                self.open_mapping(block, key.peak, key.mark)?;
                self.simple_key_allowed = false;
            }
            None => {
                self.open_mapping(Block::Mapping(now.column), 0, now)?;
                self.simple_key_allowed = self.flows.is_empty();
            }
        }
        Ok(())
    }

    fn key_slot(&mut self) -> &mut Option<Key> {
        match self.flows.last_mut() {
            Some(flow) => &mut flow.key,
            None => &mut self.block_key,
        }
    }

    fn save_key(&mut self) {
        if self.simple_key_allowed {
            let key = Key {
                mark: self.mark,
                peak: self.depth(),
            };
            *self.key_slot() = Some(key);
        }
    }

    fn remove_key(&mut self) {
        *self.key_slot() = None;
    }

    /// `yaml_parser_scan_to_next_token`: blanks, comments and line breaks.
    fn skip_to_token(&mut self) {
        loop {
            if self.mark.column == 0 && self.text[self.mark.at..].starts_with(BOM) {
                self.advance();
            }
            while self.byte(0) == Some(b' ')
                || ((!self.flows.is_empty() || !self.simple_key_allowed)
                    && self.byte(0) == Some(b'\t'))
            {
                self.advance();
            }
            if self.byte(0) == Some(b'#') {
                while !self.breakz(0) {
                    self.advance();
                }
            }
            if !self.is_break() {
                return;
            }
            self.line_break();
            if self.flows.is_empty() {
                self.simple_key_allowed = true;
            }
        }
    }
}

/// The UTF-8 byte order mark, skipped where libyaml skips it.
const BOM: &[u8] = b"\xEF\xBB\xBF";
