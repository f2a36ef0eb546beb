//! The text syntax: a hand-written lexer and recursive-descent parser.
//!
//! ```text
//! query      := given* match* order? limit? select
//! given      := "given" LABEL ":" TYPE
//! match      := "match" LABEL ":" TYPE ("where" condition ("and" condition)*)?
//! condition  := "not"? "exists" "(" match+ ")"
//!             | path "=" path                       -- a join through predecessor roles
//!             | LABEL "." FIELD OP value            -- OP is = != < <= > >=
//!             | LABEL "." FIELD "in" "[" value ("," value)* "]"
//! path       := LABEL ("->" ROLE)*
//! order      := "order" "by" key ("," key)*
//! key        := (LABEL "." FIELD | "seq" "(" LABEL ")") ("asc" | "desc")?
//! limit      := "limit" INTEGER
//! select     := "select" projection
//! projection := LABEL | "hash" "(" LABEL ")" | "seq" "(" LABEL ")" | LABEL "." FIELD
//!             | "{" NAME ":" projection ("," NAME ":" projection)* "}"
//!             | "[" match+ order? limit? "select" projection "]"
//! value      := INTEGER | FLOAT | "text" | x"hex" | true | false | null
//! ```
//! TYPE, ROLE, FIELD and NAME are identifiers (a TYPE may contain dots) or quoted text.
//! `--` starts a comment that runs to the end of the line.

use super::QueryError;
use super::model::*;
use super::value::Op;
use crate::fact::Value;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Bytes(Vec<u8>),
    Int(i128),
    Float(f64),
    Punct(&'static str),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("{s:?}"),
            Tok::Str(s) => format!("text {s:?}"),
            Tok::Bytes(_) => "bytes".into(),
            Tok::Int(i) => format!("{i}"),
            Tok::Float(f) => format!("{f}"),
            Tok::Punct(p) => format!("{p:?}"),
            Tok::End => "the end of the query".into(),
        }
    }
}

const PUNCT: &[&str] = &[
    "->", "!=", "<=", ">=", "=", "<", ">", ":", ",", ".", "(", ")", "{", "}", "[", "]",
];

const KEYWORDS: &[&str] = &[
    "given", "match", "where", "and", "exists", "not", "in", "order", "by", "asc", "desc", "limit",
    "select", "true", "false", "null",
];

fn lex(text: &str) -> Result<Vec<(Tok, Pos)>, QueryError> {
    let chars: Vec<char> = text.chars().collect();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    let mut out = Vec::new();
    let bad = |line, column, message: String| QueryError {
        line,
        column,
        message,
    };
    while i < chars.len() {
        let c = chars[i];
        let pos = Pos { line, column: col };
        let advance = |n: usize, i: &mut usize, col: &mut usize| {
            *i += n;
            *col += n;
        };
        if c == '\n' {
            i += 1;
            line += 1;
            col = 1;
        } else if c.is_whitespace() {
            advance(1, &mut i, &mut col);
        } else if c == '-' && chars.get(i + 1) == Some(&'-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '"' || (c == 'x' && chars.get(i + 1) == Some(&'"')) {
            let bytes = c == 'x';
            let start = i;
            i += if bytes { 2 } else { 1 };
            let mut s = String::new();
            loop {
                match chars.get(i) {
                    None | Some('\n') => {
                        return Err(bad(line, pos.column, "text without its closing \"".into()));
                    }
                    Some('"') => break,
                    Some('\\') => {
                        let e = chars.get(i + 1).copied();
                        s.push(match e {
                            Some('n') => '\n',
                            Some('t') => '\t',
                            Some('"') => '"',
                            Some('\\') => '\\',
                            _ => {
                                return Err(bad(
                                    line,
                                    col + i - start,
                                    "unknown escape (expected \\n, \\t, \\\" or \\\\)".into(),
                                ));
                            }
                        });
                        i += 2;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            i += 1;
            col += i - start;
            if bytes {
                let b = hex::decode(&s).map_err(|_| {
                    bad(
                        pos.line,
                        pos.column,
                        format!("x\"{s}\" is not even-length hex"),
                    )
                })?;
                out.push((Tok::Bytes(b), pos));
            } else {
                out.push((Tok::Str(s), pos));
            }
        } else if c.is_ascii_digit()
            || (c == '-' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            i += 1;
            let mut float = false;
            while let Some(&d) = chars.get(i) {
                let exp_sign = (d == '-' || d == '+') && matches!(chars[i - 1], 'e' | 'E');
                if d.is_ascii_digit() || exp_sign {
                } else if (d == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
                    || d == 'e'
                    || d == 'E'
                {
                    float = true;
                } else {
                    break;
                }
                i += 1;
            }
            let s: String = chars[start..i].iter().collect();
            col += i - start;
            let tok = if float {
                match s.parse::<f64>() {
                    Ok(f) if f.is_finite() => Tok::Float(f),
                    _ => return Err(bad(pos.line, pos.column, format!("bad number {s}"))),
                }
            } else {
                match s.parse::<i128>() {
                    Ok(n)
                        if (crate::fact::limits::MIN_INT..=crate::fact::limits::MAX_INT)
                            .contains(&n) =>
                    {
                        Tok::Int(n)
                    }
                    _ => {
                        return Err(bad(
                            pos.line,
                            pos.column,
                            format!("integer {s} is outside -2^64..2^64-1"),
                        ));
                    }
                }
            };
            out.push((tok, pos));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while chars
                .get(i)
                .is_some_and(|d| d.is_alphanumeric() || *d == '_')
            {
                i += 1;
            }
            col += i - start;
            out.push((Tok::Ident(chars[start..i].iter().collect()), pos));
        } else if let Some(p) = PUNCT.iter().find(|p| {
            let n = p.chars().count();
            chars[i..].iter().take(n).copied().eq(p.chars())
        }) {
            advance(p.len(), &mut i, &mut col);
            out.push((Tok::Punct(p), pos));
        } else {
            return Err(bad(
                pos.line,
                pos.column,
                format!("unexpected character {c:?}"),
            ));
        }
    }
    out.push((Tok::End, Pos { line, column: col }));
    Ok(out)
}

/// Deepest nesting of `exists`, records and child collections. The parser and the checks
/// recurse once per level, so without a bound a long enough query would overflow the stack.
pub const MAX_NESTING: usize = 64;

struct Parser {
    toks: Vec<(Tok, Pos)>,
    at: usize,
    depth: usize,
}

/// Parses and checks a query.
pub(crate) fn parse(text: &str) -> Result<Query, QueryError> {
    let mut p = Parser {
        toks: lex(text)?,
        at: 0,
        depth: 0,
    };
    let q = p.query()?;
    q.check()?;
    Ok(q)
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.at].0
    }
    fn pos(&self) -> Pos {
        self.toks[self.at].1
    }
    fn next(&mut self) -> (Tok, Pos) {
        let t = self.toks[self.at].clone();
        if t.0 != Tok::End {
            self.at += 1;
        }
        t
    }
    fn expected(&self, what: &str) -> QueryError {
        let pos = self.pos();
        QueryError {
            line: pos.line,
            column: pos.column,
            message: format!("expected {what}, found {}", self.peek().describe()),
        }
    }
    fn is_kw(&self, kw: &str) -> bool {
        matches!(self.peek(), Tok::Ident(s) if s == kw)
    }
    fn eat_kw(&mut self, kw: &str) -> bool {
        let yes = self.is_kw(kw);
        if yes {
            self.next();
        }
        yes
    }
    fn kw(&mut self, kw: &str) -> Result<(), QueryError> {
        if self.eat_kw(kw) {
            Ok(())
        } else {
            Err(self.expected(kw))
        }
    }
    fn is_punct(&self, p: &str) -> bool {
        matches!(self.peek(), Tok::Punct(q) if *q == p)
    }
    fn eat(&mut self, p: &str) -> bool {
        let yes = self.is_punct(p);
        if yes {
            self.next();
        }
        yes
    }
    fn punct(&mut self, p: &str, what: &str) -> Result<(), QueryError> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(self.expected(&format!("{p:?} {what}")))
        }
    }

    /// Enters one level of nesting; refused past [`MAX_NESTING`].
    fn nest(&mut self) -> Result<(), QueryError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            let pos = self.pos();
            return Err(QueryError {
                line: pos.line,
                column: pos.column,
                message: format!(
                    "nesting deeper than {MAX_NESTING} levels of exists, records and collections"
                ),
            });
        }
        Ok(())
    }

    fn label(&mut self) -> Result<Label, QueryError> {
        match self.peek() {
            Tok::Ident(s) if !KEYWORDS.contains(&s.as_str()) => {
                let (Tok::Ident(name), pos) = self.next() else {
                    unreachable!()
                };
                Ok(Label { name, pos })
            }
            _ => Err(self.expected("a label")),
        }
    }

    /// An identifier or quoted text naming a role, field or record key.
    fn name(&mut self, what: &str) -> Result<String, QueryError> {
        match self.peek().clone() {
            Tok::Ident(s) | Tok::Str(s) => {
                self.next();
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn type_name(&mut self) -> Result<String, QueryError> {
        if let Tok::Str(s) = self.peek().clone() {
            self.next();
            return Ok(s);
        }
        let mut s = match self.peek().clone() {
            Tok::Ident(s) => s,
            _ => return Err(self.expected("a fact type")),
        };
        self.next();
        while self.is_punct(".") {
            self.next();
            match self.peek().clone() {
                Tok::Ident(part) => {
                    self.next();
                    s.push('.');
                    s.push_str(&part);
                }
                _ => return Err(self.expected("the rest of the type name after \".\"")),
            }
        }
        Ok(s)
    }

    fn query(&mut self) -> Result<Query, QueryError> {
        let mut givens = Vec::new();
        while self.eat_kw("given") {
            let label = self.label()?;
            self.punct(":", "after the label")?;
            givens.push(Given {
                label,
                type_name: self.type_name()?,
            });
        }
        let matches = self.matches(false)?;
        let (order, limit) = self.order_limit()?;
        if !self.is_kw("select") {
            let what = if givens.is_empty() && matches.is_empty() {
                "given, match or select"
            } else {
                "match, where, and, order by, limit or select"
            };
            return Err(self.expected(what));
        }
        self.next();
        let select = self.projection()?;
        if *self.peek() != Tok::End {
            return Err(self.expected("the end of the query"));
        }
        Ok(Query {
            givens,
            matches,
            order,
            limit,
            select,
        })
    }

    fn matches(&mut self, at_least_one: bool) -> Result<Vec<Match>, QueryError> {
        let mut out = Vec::new();
        if at_least_one && !self.is_kw("match") {
            return Err(self.expected("match"));
        }
        while self.eat_kw("match") {
            let label = self.label()?;
            self.punct(":", "after the label")?;
            let type_name = self.type_name()?;
            let mut conditions = Vec::new();
            if self.eat_kw("where") {
                conditions.push(self.condition()?);
                while self.eat_kw("and") {
                    conditions.push(self.condition()?);
                }
            }
            out.push(Match {
                label,
                type_name,
                conditions,
            });
        }
        Ok(out)
    }

    fn condition(&mut self) -> Result<Condition, QueryError> {
        let pos = self.pos();
        let negated = self.eat_kw("not");
        if negated || self.is_kw("exists") {
            self.kw("exists")?;
            self.punct("(", "after exists")?;
            self.nest()?;
            let matches = self.matches(true)?;
            self.punct(")", "closing exists")?;
            self.depth -= 1;
            return Ok(Condition::Exists {
                negated,
                matches,
                pos,
            });
        }
        let left = self.path()?;
        if self.is_punct(".") {
            if !left.roles.is_empty() {
                return Err(self.expected(
                    "\"=\" (fields are read from matched facts: match the predecessor first)",
                ));
            }
            self.next();
            let field = self.name("a field name")?;
            return self.field_test(left.label, field);
        }
        if !self.is_punct("=") {
            return Err(self.expected("\"=\", \"->\" or \".\" after a label"));
        }
        self.next();
        if !matches!(self.peek(), Tok::Ident(s) if !KEYWORDS.contains(&s.as_str())) {
            let pos = self.pos();
            return Err(QueryError {
                line: pos.line,
                column: pos.column,
                message: format!(
                    "type mismatch: {} is a fact, compared here with {}; compare a field \
                     ({}.name = ...) or join to a label ({}->role = label)",
                    left.label.name,
                    self.peek().describe(),
                    left.label.name,
                    left.label.name
                ),
            });
        }
        let right = self.path()?;
        if self.is_punct(".") {
            let pos = self.pos();
            return Err(QueryError {
                line: pos.line,
                column: pos.column,
                message: format!(
                    "type mismatch: {} is a fact and a field is a value; fields compare with \
                     literal values",
                    left.label.name
                ),
            });
        }
        Ok(Condition::Join { left, right })
    }

    fn path(&mut self) -> Result<RolePath, QueryError> {
        let label = self.label()?;
        let mut roles = Vec::new();
        while self.eat("->") {
            roles.push(self.name("a role name after \"->\"")?);
        }
        Ok(RolePath { label, roles })
    }

    fn field_test(&mut self, label: Label, field: String) -> Result<Condition, QueryError> {
        let pos = self.pos();
        let test = if self.eat_kw("in") {
            self.punct("[", "after in")?;
            let mut values = vec![self.value(&label, &field)?];
            while self.eat(",") {
                values.push(self.value(&label, &field)?);
            }
            self.punct("]", "closing the list")?;
            Test::In(values)
        } else {
            let op = match self.peek() {
                Tok::Punct("=") => Op::Eq,
                Tok::Punct("!=") => Op::Ne,
                Tok::Punct("<") => Op::Lt,
                Tok::Punct("<=") => Op::Le,
                Tok::Punct(">") => Op::Gt,
                Tok::Punct(">=") => Op::Ge,
                _ => return Err(self.expected("=, !=, <, <=, >, >= or in after the field")),
            };
            self.next();
            Test::Compare(op, self.value(&label, &field)?)
        };
        Ok(Condition::Field {
            label,
            field,
            test,
            pos,
        })
    }

    fn value(&mut self, label: &Label, field: &str) -> Result<Value, QueryError> {
        let v = match self.peek().clone() {
            Tok::Int(i) => Value::Integer(i),
            Tok::Float(f) => Value::Float(f),
            Tok::Str(s) => Value::Text(s),
            Tok::Bytes(b) => Value::Bytes(b),
            Tok::Ident(s) if s == "true" => Value::Bool(true),
            Tok::Ident(s) if s == "false" => Value::Bool(false),
            Tok::Ident(s) if s == "null" => Value::Null,
            Tok::Ident(s) => {
                let pos = self.pos();
                return Err(QueryError {
                    line: pos.line,
                    column: pos.column,
                    message: format!(
                        "type mismatch: {}.{field} is a value, compared here with {s:?}; \
                         compare it with a literal (a number, \"text\", x\"hex\", true, false \
                         or null)",
                        label.name
                    ),
                });
            }
            _ => return Err(self.expected("a value")),
        };
        self.next();
        Ok(v)
    }

    fn order_limit(&mut self) -> Result<(Vec<OrderKey>, Option<u64>), QueryError> {
        let mut order = Vec::new();
        if self.eat_kw("order") {
            self.kw("by")?;
            loop {
                let by = if self.is_kw("seq") {
                    self.next();
                    self.punct("(", "after seq")?;
                    let l = self.label()?;
                    self.punct(")", "closing seq(")?;
                    SortBy::Seq(l)
                } else {
                    let l = self.label()?;
                    self.punct(".", "and a field name (or seq(label))")?;
                    SortBy::Field(l, self.name("a field name")?)
                };
                let descending = if self.eat_kw("desc") {
                    true
                } else {
                    self.eat_kw("asc");
                    false
                };
                order.push(OrderKey { by, descending });
                if !self.eat(",") {
                    break;
                }
            }
        }
        let mut limit = None;
        if self.eat_kw("limit") {
            match self.peek() {
                Tok::Int(n) if *n >= 0 && *n <= i64::MAX as i128 => {
                    limit = Some(*n as u64);
                    self.next();
                }
                _ => return Err(self.expected("a non-negative integer after limit")),
            }
        }
        Ok((order, limit))
    }

    fn projection(&mut self) -> Result<Projection, QueryError> {
        if self.eat("{") {
            self.nest()?;
            let mut items = Vec::new();
            loop {
                let at = self.pos();
                let key = self.name("a record key")?;
                if items.iter().any(|(k, _)| *k == key) {
                    return Err(QueryError {
                        line: at.line,
                        column: at.column,
                        message: format!("record key {key} repeated"),
                    });
                }
                self.punct(":", "after the record key")?;
                items.push((key, self.projection()?));
                if !self.eat(",") {
                    break;
                }
            }
            self.punct("}", "closing the record")?;
            self.depth -= 1;
            return Ok(Projection::Record(items));
        }
        if self.eat("[") {
            self.nest()?;
            let matches = self.matches(true)?;
            let (order, limit) = self.order_limit()?;
            self.kw("select")?;
            let select = self.projection()?;
            self.punct("]", "closing the collection")?;
            self.depth -= 1;
            return Ok(Projection::Collection(Box::new(SubQuery {
                matches,
                order,
                limit,
                select,
            })));
        }
        for (kw, make) in [
            ("hash", Projection::Hash as fn(Label) -> Projection),
            ("seq", Projection::Seq),
        ] {
            if self.is_kw(kw) && matches!(self.toks[self.at + 1].0, Tok::Punct("(")) {
                self.next();
                self.next();
                let l = self.label()?;
                self.punct(")", "closing the call")?;
                return Ok(make(l));
            }
        }
        let l = self.label()?;
        if self.eat(".") {
            let f = self.name("a field name")?;
            return Ok(Projection::Field(l, f));
        }
        Ok(Projection::Fact(l))
    }
}
