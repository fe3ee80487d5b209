//! A client's text shown to an operator: model names, tenants and keys in the CLI's tables and in
//! CSV. What would move a terminal's cursor, recolour it, break a row or hide text is written as an
//! escape, and a CSV cell never starts a spreadsheet formula.

use std::borrow::Cow;

/// A character a reader cannot see for what it is: a control character (C0, DEL, C1), whitespace
/// (tabs, line and paragraph separators, no-break spaces; the space too, which callers that keep
/// spaces let through), and the invisible format characters that reorder or hide text (bidi
/// overrides and isolates, zero-width ones, the byte order mark). All are in the Basic
/// Multilingual Plane.
pub fn hidden(c: char) -> bool {
    c.is_control()
        || c.is_whitespace()
        || matches!(
            c,
            '\u{61c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// `s` safe on a terminal: each [`hidden`] character but a space written as `\u{..}` (ESC as
/// `\u{1b}`), the rest as it is.
pub fn shown(s: &str) -> Cow<'_, str> {
    let escaped = |c: char| c != ' ' && hidden(c);
    if !s.contains(escaped) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if escaped(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One CSV cell (RFC 4180) of a client's text: [`shown`], so a row is one line and a terminal
/// showing the file is safe; a leading `=`, `+`, `-`, `@`, tab or CR made text with a `'` so a
/// spreadsheet does not run it as a formula (OWASP's CSV injection advice); quoted when it holds a
/// comma or a quote.
pub fn csv_cell(s: &str) -> String {
    let mut cell = shown(s).into_owned();
    if cell.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        cell.insert(0, '\'');
    }
    if cell.contains([',', '"']) {
        cell = format!("\"{}\"", cell.replace('"', "\"\""));
    }
    cell
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_sees_escapes_not_controls() {
        assert!(matches!(shown("llama-3 8B é"), Cow::Borrowed(_)));
        assert_eq!(
            shown("\u{1b}[2J\u{1b}]0;x\u{7}"),
            "\\u{1b}[2J\\u{1b}]0;x\\u{7}"
        );
        assert_eq!(shown("a\nb\tc\u{9b}d"), "a\\u{a}b\\u{9}c\\u{9b}d");
        assert_eq!(shown("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(shown("line\u{2028}sep"), "line\\u{2028}sep");
    }

    #[test]
    fn a_csv_cell_is_never_a_formula_nor_two_rows() {
        assert_eq!(csv_cell("plain"), "plain");
        assert_eq!(
            csv_cell("=HYPERLINK(\"http://x\",\"y\")"),
            "\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\""
        );
        for formula in ["+1", "-1+2", "@SUM(A1)", "=1"] {
            assert_eq!(csv_cell(formula), format!("'{formula}"));
        }
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("\tx"), "\\u{9}x");
        assert_eq!(csv_cell("one\ntwo"), "one\\u{a}two");
        // Inside a cell a sign is no formula.
        assert_eq!(csv_cell("x=1"), "x=1");
    }
}
