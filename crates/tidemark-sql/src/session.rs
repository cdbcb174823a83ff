//! Statements about the session rather than the data: transactions and settings, which
//! PostgreSQL clients send on their own (psycopg2 opens a transaction before its first
//! query). Tidemark's reads need neither: a transport answers these as done, and says so in
//! its docs, instead of refusing clients that never asked for them.

use datafusion::sql::sqlparser::ast::{DiscardObject, Statement};

use crate::bounds::one_statement;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionStatement {
    Begin,
    Commit,
    Rollback,
    /// `SET name = value`, `RESET name`, `RESET ALL`, `DISCARD PLANS`: accepted, change
    /// nothing (a setting is never kept); the command's tag.
    Set(&'static str),
    /// `SAVEPOINT`, `RELEASE`, `ROLLBACK TO`: accepted, change nothing; the command's tag.
    Savepoint(&'static str),
    /// `DISCARD ALL`: what a pooler sends to reset a connection; it closes every prepared
    /// statement.
    Reset,
    /// `DEALLOCATE name`, or `DEALLOCATE ALL` (`None`): closes prepared statements.
    Deallocate(Option<String>),
    /// `SHOW name`, lowercase.
    Show(String),
}

/// The session statement `sql` is, if it is one statement and one of those; `None` for
/// anything else, including text that does not parse (the query path says why).
pub fn session_statement(sql: &str) -> Option<SessionStatement> {
    one_statement(sql).and_then(session_statement_of)
}

/// The session statement `statement` is, if it is one.
pub fn session_statement_of(statement: Statement) -> Option<SessionStatement> {
    Some(match statement {
        Statement::StartTransaction { .. } => SessionStatement::Begin,
        Statement::Commit { .. } => SessionStatement::Commit,
        // SQLAlchemy nests transactions in savepoints: nothing to keep or undo.
        Statement::Savepoint { .. } => SessionStatement::Savepoint("SAVEPOINT"),
        Statement::ReleaseSavepoint { .. } => SessionStatement::Savepoint("RELEASE"),
        Statement::Rollback {
            savepoint: Some(_), ..
        } => SessionStatement::Savepoint("ROLLBACK"),
        Statement::Rollback { .. } => SessionStatement::Rollback,
        Statement::Set(_) => SessionStatement::Set("SET"),
        Statement::Reset(_) => SessionStatement::Set("RESET"),
        Statement::Discard {
            object_type: DiscardObject::ALL,
        } => SessionStatement::Reset,
        // Plans, temporary tables and sequences: Tidemark keeps none.
        Statement::Discard { .. } => SessionStatement::Set("DISCARD"),
        Statement::Deallocate { name, .. }
            if name.quote_style.is_none() && name.value.eq_ignore_ascii_case("all") =>
        {
            SessionStatement::Deallocate(None)
        }
        // As PostgreSQL: an unquoted name is folded to lower case.
        Statement::Deallocate { name, .. } => {
            SessionStatement::Deallocate(Some(match name.quote_style {
                None => name.value.to_lowercase(),
                Some(_) => name.value,
            }))
        }
        Statement::ShowVariable { variable } => SessionStatement::Show(
            variable
                .iter()
                .map(|part| part.value.to_ascii_lowercase())
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => return None,
    })
}

/// The PostgreSQL version Tidemark answers as: clients pick their catalog queries by its
/// major version.
pub const POSTGRES_VERSION: &str = "16.6";

/// `server_version_num` of [`POSTGRES_VERSION`].
const POSTGRES_VERSION_NUM: &str = "160006";

/// What `SHOW name` and `current_setting('name')` answer (`name` lowercase), and what a
/// client is told on connect: one list for both.
pub fn setting(name: &str) -> Option<String> {
    Some(match name {
        "server_version" => server_version(),
        "server_version_num" => POSTGRES_VERSION_NUM.into(),
        "server_encoding" | "client_encoding" => "UTF8".into(),
        "datestyle" => "ISO, YMD".into(),
        "timezone" | "time zone" => "Etc/UTC".into(),
        "intervalstyle" => "postgres".into(),
        "integer_datetimes" | "standard_conforming_strings" => "on".into(),
        "search_path" => "public".into(),
        "transaction_isolation" | "transaction isolation level" => "read committed".into(),
        // SQL only reads (streams are written through the write API).
        "default_transaction_read_only" | "transaction_read_only" => "on".into(),
        "is_superuser" => "off".into(),
        "max_identifier_length" => "63".into(),
        "lc_collate" | "lc_ctype" => "C".into(),
        "application_name" => String::new(),
        _ => return None,
    })
}

/// `server_version`: PostgreSQL's, then Tidemark's own.
pub fn server_version() -> String {
    format!(
        "{POSTGRES_VERSION} (Tidemark {})",
        env!("CARGO_PKG_VERSION")
    )
}

/// What `version()` answers: as PostgreSQL's, which clients parse for its version.
pub fn version() -> String {
    format!(
        "PostgreSQL {POSTGRES_VERSION} (Tidemark {}) on {}, 64-bit",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_clients_send_is_recognised() {
        for (sql, expected) in [
            ("BEGIN", Some(SessionStatement::Begin)),
            (
                "begin transaction isolation level read committed",
                Some(SessionStatement::Begin),
            ),
            ("COMMIT", Some(SessionStatement::Commit)),
            ("ROLLBACK", Some(SessionStatement::Rollback)),
            ("SET DateStyle = 'ISO'", Some(SessionStatement::Set("SET"))),
            ("SET TIME ZONE 'UTC'", Some(SessionStatement::Set("SET"))),
            ("RESET timezone", Some(SessionStatement::Set("RESET"))),
            ("RESET ALL", Some(SessionStatement::Set("RESET"))),
            ("DISCARD ALL", Some(SessionStatement::Reset)),
            ("DEALLOCATE ALL", Some(SessionStatement::Deallocate(None))),
            (
                "DEALLOCATE PREPARE _pg3_7",
                Some(SessionStatement::Deallocate(Some("_pg3_7".into()))),
            ),
            (
                "deallocate S1",
                Some(SessionStatement::Deallocate(Some("s1".into()))),
            ),
            (
                "DEALLOCATE \"all\"",
                Some(SessionStatement::Deallocate(Some("all".into()))),
            ),
            ("DISCARD PLANS", Some(SessionStatement::Set("DISCARD"))),
            (
                "SHOW TimeZone",
                Some(SessionStatement::Show("timezone".into())),
            ),
            (
                "SHOW TRANSACTION ISOLATION LEVEL",
                Some(SessionStatement::Show("transaction isolation level".into())),
            ),
            ("SELECT 1", None),
            ("SHOW TABLES", None),
            ("BEGIN; SELECT 1", None),
            ("BEGN", None),
        ] {
            assert_eq!(session_statement(sql), expected, "{sql}");
        }
    }
}
