//! Bounds on SQL text, checked before it is parsed, so that no statement can make the
//! parser, the planner or the AST's own `Display` and `Drop` recurse deeper than a thread's
//! stack.
//!
//! Nesting (parentheses, function calls, unary operators) is bounded by the parser's
//! recursion limit. A chain of infix operators (`1+1+...+1`, `a=1 AND a=1 AND ...`) is not:
//! the parser builds it in a loop, so the tree is as deep as the chain is long, and every
//! later walk of it recurses that deep. Those chains are bounded here by counting the tokens
//! that can join two expressions, before any tree exists.

use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::SqlError;

/// The longest SQL text accepted.
pub const MAX_SQL_BYTES: usize = 1 << 20;
/// Keywords and operator symbols one statement may hold (each can add one level to the tree).
pub const MAX_OPERATORS: usize = 1_000;
/// How deeply parentheses, function calls and unary operators may nest.
pub const MAX_NESTING: usize = 64;

/// Parses `sql` into statements, refusing text beyond the bounds above.
pub fn parse_bounded(sql: &str) -> Result<Vec<Statement>, SqlError> {
    if sql.len() > MAX_SQL_BYTES {
        return Err(SqlError::TooComplex(format!(
            "the statement has {} bytes; the limit is {MAX_SQL_BYTES}",
            sql.len()
        )));
    }
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| SqlError::Syntax(e.to_string()))?;
    let operators = count_operators(tokens.iter().map(|t| &t.token));
    if operators > MAX_OPERATORS {
        return Err(SqlError::TooComplex(format!(
            "the statement has {operators} operators and keywords; the limit is {MAX_OPERATORS}"
        )));
    }
    Parser::new(&dialect)
        .with_recursion_limit(MAX_NESTING)
        .with_tokens_with_locations(tokens)
        .parse_statements()
        .map_err(|e| match e {
            datafusion::sql::sqlparser::parser::ParserError::RecursionLimitExceeded => {
                SqlError::TooComplex(format!(
                    "expressions nest more than {MAX_NESTING} levels deep"
                ))
            }
            other => SqlError::Syntax(other.to_string()),
        })
}

/// The one statement of `sql`, parsed within the bounds; `None` for several, none, or text
/// that does not parse (the query path says why).
pub fn one_statement(sql: &str) -> Option<Statement> {
    let mut statements = parse_bounded(sql).ok()?;
    statements.pop().filter(|_| statements.is_empty())
}

/// The operators and keywords of `sql` as [`parse_bounded`] counts them.
pub fn operators(sql: &str) -> Result<usize, SqlError> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| SqlError::Syntax(e.to_string()))?;
    Ok(count_operators(tokens.iter()))
}

/// Tokens that may join two expressions: keywords and operator symbols. Not counted: names,
/// `NULL`, `TRUE`, `FALSE`, literals, separators, parentheses (nesting, bounded by the
/// parser), and a sign in front of an operand (a unary operator, also nesting).
fn count_operators<'a>(tokens: impl Iterator<Item = &'a Token>) -> usize {
    let mut count = 0;
    // Whether the previous significant token ends an operand, so that `-` after it is infix.
    let mut after_operand = false;
    for token in tokens {
        let (counts, ends_operand) = match token {
            Token::Whitespace(_) | Token::EOF => continue,
            // Names, and the keywords that are values (an INSERT's rows are full of them).
            Token::Word(word)
                if matches!(
                    word.keyword,
                    Keyword::NoKeyword | Keyword::NULL | Keyword::TRUE | Keyword::FALSE
                ) =>
            {
                (false, true)
            }
            Token::Word(_) => (true, false),
            Token::Number(..)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::NationalStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::HexStringLiteral(_)
            | Token::RParen => (false, true),
            Token::Comma | Token::LParen | Token::SemiColon | Token::Period => (false, false),
            Token::Minus | Token::Plus if !after_operand => (false, false),
            _ => (true, false),
        };
        count += usize::from(counts);
        after_operand = ends_operand;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operators(sql: &str) -> usize {
        let tokens = Tokenizer::new(&GenericDialect {}, sql).tokenize().unwrap();
        count_operators(tokens.iter())
    }

    #[test]
    fn infix_operators_and_keywords_count_signs_and_lists_do_not() {
        assert_eq!(operators("SELECT a FROM t"), 2);
        assert_eq!(operators("SELECT 1 + 1 - 2 * x"), 4);
        // Signs in a list are unary: nesting, which the parser bounds.
        assert_eq!(operators("SELECT a FROM t WHERE a IN (-1, -2, +3)"), 4);
        assert_eq!(operators("SELECT a FROM t WHERE a = 'x' AND b = 'y'"), 6);
    }

    #[test]
    fn long_chains_and_deep_nesting_are_refused_before_parsing() {
        let chain = format!("SELECT 1{}", "+1".repeat(MAX_OPERATORS));
        assert!(matches!(
            parse_bounded(&chain),
            Err(SqlError::TooComplex(m)) if m.contains("operators")
        ));
        let nested = format!(
            "SELECT {}1{}",
            "(".repeat(MAX_NESTING + 1),
            ")".repeat(MAX_NESTING + 1)
        );
        assert!(matches!(
            parse_bounded(&nested),
            Err(SqlError::TooComplex(m)) if m.contains("nest")
        ));
        let signs = format!("SELECT {}1", "- ".repeat(MAX_NESTING * 4));
        assert!(matches!(
            parse_bounded(&signs),
            Err(SqlError::TooComplex(_))
        ));
        let long = format!("SELECT '{}'", "x".repeat(MAX_SQL_BYTES));
        assert!(
            matches!(parse_bounded(&long), Err(SqlError::TooComplex(m)) if m.contains("bytes"))
        );
    }

    #[test]
    fn a_chain_just_inside_the_bound_parses_and_prints() {
        // The tree is as deep as the chain: printing and dropping it must fit a thread's stack.
        let chain = format!("SELECT 1{}", "+1".repeat(MAX_OPERATORS - 1));
        let statements = parse_bounded(&chain).unwrap();
        assert!(statements[0].to_string().len() > MAX_OPERATORS * 2);
        let long_in = format!(
            "SELECT a FROM t WHERE a IN ({})",
            vec!["-1"; 10 * MAX_OPERATORS].join(",")
        );
        assert!(parse_bounded(&long_in).is_ok());
    }
}
