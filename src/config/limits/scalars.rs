//! The parts of libyaml's scanner that decide where a scalar ends, and the character
//! classes they use: what the nesting count must skip, exactly as far as the parser
//! does.

use super::{Halt, Scan};

impl Scan<'_> {
    /// Whether `c` (not an indicator that `run` handled) starts a plain scalar.
    pub(super) fn plain_starts(&self, c: u8) -> bool {
        let indicator = self.blankz(0) || b"-?:,[]{}#&*!|>'\"%@`".contains(&c);
        !indicator
            || (c == b'-' && !self.blank(1))
            || (self.flows.is_empty() && (c == b'?' || c == b':') && !self.blankz(1))
    }

    /// `yaml_parser_scan_plain_scalar`: it may run over several lines, as long as they
    /// are indented more than the enclosing block collection (in a flow collection, any
    /// line).
    pub(super) fn plain(&mut self) -> Result<(), Halt> {
        let flow = !self.flows.is_empty();
        let min_column = self.indent().map_or(0, |c| c + 1);
        let mut leading_blanks = false;
        loop {
            if (self.mark.column == 0 && self.document_marker()) || self.byte(0) == Some(b'#') {
                break;
            }
            while !self.blankz(0) {
                let c = self.byte(0);
                if flow && c == Some(b':') && self.byte(1).is_some_and(|b| b",?[]{}".contains(&b)) {
                    // "found unexpected ':'"
                    return Err(Halt::Unparsable);
                }
                if (c == Some(b':') && self.blankz(1)) || (flow && self.flow_indicator(0)) {
                    break;
                }
                self.advance();
            }
            if !(self.blank(0) || self.is_break()) {
                break;
            }
            while self.blank(0) || self.is_break() {
                if self.blank(0) {
                    if leading_blanks
                        && self.mark.column < min_column
                        && self.byte(0) == Some(b'\t')
                    {
                        // "found a tab character that violates indentation"
                        return Err(Halt::Unparsable);
                    }
                    self.advance();
                } else {
                    self.line_break();
                    leading_blanks = true;
                }
            }
            if !flow && self.mark.column < min_column {
                break;
            }
        }
        if leading_blanks {
            self.simple_key_allowed = true;
        }
        Ok(())
    }

    /// `yaml_parser_scan_flow_scalar`: up to the closing quote, over any lines.
    pub(super) fn quoted(&mut self, quote: u8) -> Result<(), Halt> {
        self.advance();
        loop {
            if (self.mark.column == 0 && self.document_marker()) || self.byte(0).is_none() {
                // "found unexpected document indicator" / "end of stream"
                return Err(Halt::Unparsable);
            }
            while !self.blankz(0) {
                let c = self.byte(0);
                if quote == b'\'' && c == Some(b'\'') && self.byte(1) == Some(b'\'') {
                    self.advance();
                    self.advance();
                } else if c == Some(quote) {
                    self.advance();
                    return Ok(());
                } else if quote == b'"' && c == Some(b'\\') {
                    self.advance();
                    if self.is_break() {
                        self.line_break();
                        break;
                    }
                    // The escaped character; any hex digits that follow are plain text.
                    self.advance();
                } else {
                    self.advance();
                }
            }
            while self.blank(0) || self.is_break() {
                if self.is_break() {
                    self.line_break();
                } else {
                    self.advance();
                }
            }
        }
    }

    /// `yaml_parser_scan_block_scalar`: the header line, then every line indented at
    /// least as much as the content (found on its first non-empty line), and empty
    /// lines.
    pub(super) fn block_scalar(&mut self) -> Result<(), Halt> {
        self.advance();
        let mut increment = 0;
        for _ in 0..2 {
            match self.byte(0) {
                Some(b'+' | b'-') => self.advance(),
                Some(b'0') => return Err(Halt::Unparsable),
                Some(d @ b'1'..=b'9') if increment == 0 => {
                    increment = usize::from(d - b'0');
                    self.advance();
                }
                _ => break,
            }
        }
        while self.blank(0) {
            self.advance();
        }
        if self.byte(0) == Some(b'#') {
            while !self.breakz(0) {
                self.advance();
            }
        }
        if !self.breakz(0) {
            // "did not find expected comment or line break"
            return Err(Halt::Unparsable);
        }
        if self.is_break() {
            self.line_break();
        }
        let mut indent = match (increment, self.indent()) {
            (0, _) => 0,
            (n, Some(column)) => column + n,
            (n, None) => n,
        };
        self.block_scalar_breaks(&mut indent)?;
        while self.mark.column == indent && self.byte(0).is_some() {
            while !self.breakz(0) {
                self.advance();
            }
            if self.is_break() {
                self.line_break();
            }
            self.block_scalar_breaks(&mut indent)?;
        }
        Ok(())
    }

    /// `yaml_parser_scan_block_scalar_breaks`: indentation and empty lines; fixes the
    /// content's indentation (`indent == 0`) from the first non-empty line.
    fn block_scalar_breaks(&mut self, indent: &mut usize) -> Result<(), Halt> {
        let mut max_indent = 0;
        loop {
            while (*indent == 0 || self.mark.column < *indent) && self.byte(0) == Some(b' ') {
                self.advance();
            }
            max_indent = max_indent.max(self.mark.column);
            if (*indent == 0 || self.mark.column < *indent) && self.byte(0) == Some(b'\t') {
                // "found a tab character where an indentation space is expected"
                return Err(Halt::Unparsable);
            }
            if !self.is_break() {
                break;
            }
            self.line_break();
        }
        if *indent == 0 {
            *indent = max_indent.max(self.indent().map_or(0, |c| c + 1)).max(1);
        }
        Ok(())
    }

    /// `---` or `...` followed by a blank, a line break or the end.
    pub(super) fn document_marker(&self) -> bool {
        let rest = &self.text[self.mark.at..];
        (rest.starts_with(b"---") || rest.starts_with(b"...")) && self.blankz(3)
    }

    pub(super) fn skip_line(&mut self) {
        while !self.breakz(0) {
            self.advance();
        }
    }

    pub(super) fn byte(&self, ahead: usize) -> Option<u8> {
        self.text.get(self.mark.at + ahead).copied()
    }

    /// `,`, `[`, `]`, `{` or `}`: what ends a plain scalar or a tag in a flow collection.
    pub(super) fn flow_indicator(&self, ahead: usize) -> bool {
        self.byte(ahead).is_some_and(|b| b",[]{}".contains(&b))
    }

    pub(super) fn blank(&self, ahead: usize) -> bool {
        matches!(self.byte(ahead), Some(b' ' | b'\t'))
    }

    /// The length of the line break `ahead` bytes on: CR, LF, CRLF, NEL, LS or PS.
    fn break_len(&self, ahead: usize) -> usize {
        let rest = self.text.get(self.mark.at + ahead..).unwrap_or_default();
        match rest {
            [b'\r', b'\n', ..] => 2,
            [b'\r' | b'\n', ..] => 1,
            [0xC2, 0x85, ..] => 2,
            [0xE2, 0x80, 0xA8 | 0xA9, ..] => 3,
            _ => 0,
        }
    }

    pub(super) fn is_break(&self) -> bool {
        self.break_len(0) > 0
    }

    pub(super) fn breakz(&self, ahead: usize) -> bool {
        self.byte(ahead).is_none() || self.break_len(ahead) > 0
    }

    pub(super) fn blankz(&self, ahead: usize) -> bool {
        self.blank(ahead) || self.breakz(ahead)
    }

    /// One character (not a line break).
    pub(super) fn advance(&mut self) {
        let width = match self.byte(0) {
            None => return,
            Some(b) if b < 0x80 => 1,
            Some(b) if b >= 0xF0 => 4,
            Some(b) if b >= 0xE0 => 3,
            Some(_) => 2,
        };
        self.mark.at = (self.mark.at + width).min(self.text.len());
        self.mark.column += 1;
    }

    pub(super) fn line_break(&mut self) {
        self.mark.at += self.break_len(0);
        self.mark.line += 1;
        self.mark.column = 0;
    }
}
