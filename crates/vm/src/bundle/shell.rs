//! `cluster.env` syntax: the file upstream's `istio-start.sh` sources into pilot-agent's
//! environment with bash (`set -a; . cluster.env`). istioctl writes one `KEY=VALUE` per line
//! with shell quoting (`KEY='value'`, an embedded `'` as `'"'"'`, an empty value as `''`).
//!
//! This reads the subset of shell that assigns literal values: blank lines, `#` comments,
//! an optional `export`, and values made of single-quoted, double-quoted and unquoted pieces
//! (backslash escapes as bash has them, quotes may span lines). Anything bash would expand
//! or run (`$`, backticks, `;`, `|`, a second word) is refused with its line, never guessed
//! at: the file's meaning must not depend on the environment of whoever reads it.

use std::collections::BTreeMap;
use std::fmt;

/// One `KEY=VALUE` assignment of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The line the assignment starts on (1-based).
    pub line: usize,
    /// The variable name.
    pub key: String,
    /// The value, quotes removed.
    pub value: String,
}

/// A line bash would not read as a plain assignment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct SyntaxError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub problem: Syntax,
}

/// What is wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Syntax {
    /// Not `NAME=...` (a name is letters, digits and `_`, not starting with a digit).
    NotAnAssignment,
    /// A quote opened and never closed before the end of the file.
    UnterminatedQuote(char),
    /// `$` or a backtick: bash would expand it.
    Expansion(char),
    /// A shell operator (`;`, `&`, `|`, `<`, `>`, `(`, `)`): bash would run something.
    Operator(char),
    /// More after the value: bash would run the rest as a command.
    TrailingWords,
    /// The same key assigned twice (bash keeps the last; which one was meant is unclear).
    Duplicate {
        /// The line of the first assignment.
        first: usize,
    },
}

impl fmt::Display for Syntax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAnAssignment => f.write_str("expected KEY='value'"),
            Self::UnterminatedQuote(q) => write!(f, "the {q} quote is never closed"),
            Self::Expansion(c) => write!(
                f,
                "{c:?} would be expanded by the shell; quote the value with '...'"
            ),
            Self::Operator(c) => write!(f, "{c:?} is a shell operator; quote the value with '...'"),
            Self::TrailingWords => f.write_str(
                "more than one word after '=' (the shell would run the rest as a command); \
                 quote the value with '...'",
            ),
            Self::Duplicate { first } => write!(f, "the key is already set on line {first}"),
        }
    }
}

/// Reads every assignment of `text`, in file order, and every bad line. The good lines are
/// kept even when others are bad (the first of a duplicated key), so a caller does not report
/// their keys as missing.
pub fn parse(text: &str) -> (Vec<Assignment>, Vec<SyntaxError>) {
    let mut p = Parser {
        chars: text.chars().collect(),
        pos: 0,
        line: 1,
    };
    let mut out: Vec<Assignment> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut errors = Vec::new();
    while !p.at_end() {
        let start = p.line;
        match p.statement() {
            Ok(None) => {}
            Ok(Some((key, value))) => {
                if let Some(&first) = seen.get(&key) {
                    errors.push(SyntaxError {
                        line: start,
                        problem: Syntax::Duplicate { first },
                    });
                } else {
                    seen.insert(key.clone(), start);
                    out.push(Assignment {
                        line: start,
                        key,
                        value,
                    });
                }
            }
            Err(problem) => {
                errors.push(SyntaxError {
                    line: p.line,
                    problem,
                });
                p.skip_line();
            }
        }
    }
    (out, errors)
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
    line: usize,
}

impl Parser {
    fn at_end(&self) -> bool {
        self.pos >= self.chars.len()
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\r')) {
            self.bump();
        }
    }

    /// Consumes up to and including the next newline.
    fn skip_line(&mut self) {
        while let Some(c) = self.bump() {
            if c == '\n' {
                break;
            }
        }
    }

    /// One line: nothing (blank or comment) or an assignment; consumes its newline.
    fn statement(&mut self) -> Result<Option<(String, String)>, Syntax> {
        self.skip_blanks();
        match self.peek() {
            None => return Ok(None),
            Some('\n') | Some('#') => {
                self.skip_line();
                return Ok(None);
            }
            Some(_) => {}
        }
        let mut key = self.name();
        if key == "export" && matches!(self.peek(), Some(' ' | '\t')) {
            self.skip_blanks();
            key = self.name();
        }
        if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(Syntax::NotAnAssignment);
        }
        if self.peek() != Some('=') {
            return Err(Syntax::NotAnAssignment);
        }
        self.bump();
        let value = self.word()?;
        self.skip_blanks();
        match self.peek() {
            None => {}
            Some('\n') => {
                self.bump();
            }
            Some('#') => self.skip_line(),
            Some(_) => return Err(Syntax::TrailingWords),
        }
        Ok(Some((key, value)))
    }

    fn name(&mut self) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                s.push(c);
                self.bump();
            } else {
                break;
            }
        }
        s
    }

    /// The value: quoted and unquoted pieces up to an unquoted blank or newline.
    fn word(&mut self) -> Result<String, Syntax> {
        let mut v = String::new();
        loop {
            match self.peek() {
                None | Some(' ' | '\t' | '\r' | '\n') => return Ok(v),
                Some('\'') => {
                    self.bump();
                    loop {
                        match self.bump() {
                            None => return Err(Syntax::UnterminatedQuote('\'')),
                            Some('\'') => break,
                            Some(c) => v.push(c),
                        }
                    }
                }
                Some('"') => {
                    self.bump();
                    loop {
                        match self.bump() {
                            None => return Err(Syntax::UnterminatedQuote('"')),
                            Some('"') => break,
                            Some(c @ ('$' | '`')) => return Err(Syntax::Expansion(c)),
                            Some('\\') => match self.bump() {
                                None => return Err(Syntax::UnterminatedQuote('"')),
                                // A backslash-newline inside double quotes joins the lines.
                                Some('\n') => {}
                                Some(c @ ('$' | '`' | '"' | '\\')) => v.push(c),
                                Some(c) => {
                                    v.push('\\');
                                    v.push(c);
                                }
                            },
                            Some(c) => v.push(c),
                        }
                    }
                }
                Some('\\') => {
                    self.bump();
                    match self.bump() {
                        // A trailing backslash escapes nothing; bash drops it.
                        None => return Ok(v),
                        Some('\n') => {}
                        Some(c) => v.push(c),
                    }
                }
                Some(c @ ('$' | '`')) => return Err(Syntax::Expansion(c)),
                Some(c @ (';' | '&' | '|' | '<' | '>' | '(' | ')')) => {
                    return Err(Syntax::Operator(c));
                }
                Some(c) => {
                    self.bump();
                    v.push(c);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        let cases: &[(&str, &str)] = &[
            ("K='latest'", "latest"),
            ("K=''", ""),
            ("K=", ""),
            ("K=plain", "plain"),
            ("K=22,15090", "22,15090"),
            ("export K='x'", "x"),
            ("K='it'\"'\"'s'", "it's"),
            ("K='{\"a\":\"b c\"}'", "{\"a\":\"b c\"}"),
            ("K=\"a \\\"b\\\" \\$ \\n\"", "a \"b\" $ \\n"),
            ("K=a\\ b", "a b"),
            ("K='x'  # comment", "x"),
            ("K=a#b", "a#b"),
            ("K='two\nlines'", "two\nlines"),
            ("K=\"joined\\\nline\"", "joinedline"),
            ("  K='indented'\r", "indented"),
        ];
        for (text, want) in cases {
            let (got, errs) = parse(text);
            assert!(errs.is_empty(), "{text:?}: {errs:?}");
            assert_eq!(got.len(), 1, "{text:?}");
            assert_eq!(got[0].key, "K", "{text:?}");
            assert_eq!(got[0].value, *want, "{text:?}");
        }
    }

    #[test]
    fn refused() {
        let cases: &[(&str, usize, Syntax)] = &[
            ("K='open", 1, Syntax::UnterminatedQuote('\'')),
            ("K=\"open", 1, Syntax::UnterminatedQuote('"')),
            ("K=$HOME", 1, Syntax::Expansion('$')),
            ("K=\"$HOME\"", 1, Syntax::Expansion('$')),
            ("K=`id`", 1, Syntax::Expansion('`')),
            ("K=a;rm", 1, Syntax::Operator(';')),
            ("K=a b", 1, Syntax::TrailingWords),
            ("K = 'a'", 1, Syntax::NotAnAssignment),
            ("1K='a'", 1, Syntax::NotAnAssignment),
            ("just words", 1, Syntax::NotAnAssignment),
            ("\n# c\nK='a'\nK='b'", 4, Syntax::Duplicate { first: 3 }),
            ("A='x\ny'\nB c", 3, Syntax::NotAnAssignment),
        ];
        for (text, line, want) in cases {
            let (_, errs) = parse(text);
            assert_eq!(
                errs,
                vec![SyntaxError {
                    line: *line,
                    problem: want.clone()
                }],
                "{text:?}"
            );
        }
    }

    #[test]
    fn every_bad_line_is_reported_and_good_lines_are_kept_in_order() {
        let (good, errs) = parse("A='1'\nB=$x\nC='3'\nD=`y`\nA='again'\n");
        let lines: Vec<usize> = errs.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![2, 4, 5]);
        let kept: Vec<(&str, &str)> = good
            .iter()
            .map(|a| (a.key.as_str(), a.value.as_str()))
            .collect();
        assert_eq!(kept, vec![("A", "1"), ("C", "3")]);
        let (ok, errs) = parse("# head\n\nB='2'\nexport A='1'\n");
        assert!(errs.is_empty());
        let keys: Vec<(&str, usize)> = ok.iter().map(|a| (a.key.as_str(), a.line)).collect();
        assert_eq!(keys, vec![("B", 3), ("A", 4)]);
    }
}
