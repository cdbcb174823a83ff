//! The named prepared statements and portals a session holds, counted and bounded. pgwire
//! keeps each until the client closes it: without a bound one client could hold gigabytes of
//! statement text (6,000 statements of 1 MiB reached 5.8 GB). Unnamed ones are replaced by
//! the next of their kind, so they are bounded by the message size.

use std::collections::HashMap;
use std::sync::Arc;

use pgwire::error::PgWireError;
use pgwire::messages::extendedquery::{TARGET_TYPE_BYTE_PORTAL, TARGET_TYPE_BYTE_STATEMENT};
use pgwire::messages::PgWireFrontendMessage;

use super::errors::user_error;
use crate::admission::{Admission, Permit};
use crate::config::Pg;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Statement,
    Portal,
}

/// What a message does to the named things a session holds, once pgwire has done it.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    None,
    /// The unnamed statement is now one of `bytes` (portals bound to it keep it alive).
    Unnamed {
        bytes: usize,
    },
    /// Holds `name` with `bytes` (replacing one of the same name); `bytes` are reserved on
    /// the server's total until [`Named::apply`] or [`Named::undo`].
    Hold {
        kind: Kind,
        name: String,
        bytes: usize,
    },
    Close {
        kind: Kind,
        name: String,
    },
}

/// One session's named statements and portals.
pub struct Named {
    held: HashMap<(Kind, String), usize>,
    /// The unnamed statement's bytes: not held here, but a named portal bound to it keeps
    /// it alive and is charged for it.
    unnamed_statement: usize,
    bytes: usize,
    max_count: usize,
    max_bytes: usize,
    /// This session's share of `pg.max_prepared_bytes_total`, held and reserved.
    total: Permit,
    max_total: usize,
}

impl Named {
    pub fn new(limits: &Pg, total: &Arc<Admission>) -> Option<Named> {
        Some(Named {
            held: HashMap::new(),
            unnamed_statement: 0,
            bytes: 0,
            max_count: limits.max_prepared,
            max_bytes: limits.max_prepared_bytes,
            total: total.try_admit(0)?,
            max_total: limits.max_prepared_bytes_total,
        })
    }

    /// What `message` would change, refused if it would cross a bound.
    pub fn check(&mut self, message: &PgWireFrontendMessage) -> Result<Change, PgWireError> {
        let (kind, name, bytes) = match message {
            PgWireFrontendMessage::Parse(parse) => (
                Kind::Statement,
                &parse.name,
                parse.query.len() + 4 * parse.type_oids.len(),
            ),
            // A portal keeps its statement alive (even once the statement is closed, or
            // the unnamed one replaced): it is charged for it, and for its parameters.
            PgWireFrontendMessage::Bind(bind) => (
                Kind::Portal,
                &bind.portal_name,
                self.statement_bytes(&bind.statement_name)
                    + bind
                        .parameters
                        .iter()
                        .map(|p| PARAMETER_BYTES + p.as_ref().map_or(0, |p| p.len()))
                        .sum::<usize>()
                    + 2 * (bind.parameter_format_codes.len()
                        + bind.result_column_format_codes.len()),
            ),
            PgWireFrontendMessage::Close(close) => {
                let kind = match close.target_type {
                    TARGET_TYPE_BYTE_STATEMENT => Kind::Statement,
                    TARGET_TYPE_BYTE_PORTAL => Kind::Portal,
                    _ => return Ok(Change::None),
                };
                return Ok(match named(&close.name) {
                    Some(name) => Change::Close {
                        kind,
                        name: name.to_owned(),
                    },
                    None => Change::None,
                });
            }
            _ => return Ok(Change::None),
        };
        let Some(name) = named(name) else {
            return Ok(match kind {
                Kind::Statement => Change::Unnamed { bytes },
                Kind::Portal => Change::None,
            });
        };
        let bytes = bytes + name.len();
        let replaced = self.held.get(&(kind, name.to_owned())).copied();
        let count = self.held.len() + usize::from(replaced.is_none());
        if count > self.max_count {
            return Err(user_error(
                "54000",
                format!(
                    "this session holds {} named prepared statements and portals, the most \
                     it may (pg.max_prepared): close some first (Close, or DEALLOCATE)",
                    self.held.len()
                ),
            ));
        }
        if self.bytes - replaced.unwrap_or(0) + bytes > self.max_bytes {
            return Err(user_error(
                "54000",
                format!(
                    "this session's named prepared statements and portals would take {} bytes, \
                     over pg.max_prepared_bytes ({}): close some first",
                    self.bytes - replaced.unwrap_or(0) + bytes,
                    self.max_bytes
                ),
            ));
        }
        if !self.total.grow(bytes) {
            return Err(user_error(
                "53200",
                format!(
                    "the server holds pg.max_prepared_bytes_total ({} bytes) of prepared \
                     statements and portals over all sessions: try again later",
                    self.max_total
                ),
            ));
        }
        Ok(Change::Hold {
            kind,
            name: name.to_owned(),
            bytes,
        })
    }

    /// Records `change`, which pgwire has made.
    pub fn apply(&mut self, change: Change) {
        match change {
            Change::None => {}
            Change::Unnamed { bytes } => self.unnamed_statement = bytes,
            Change::Hold { kind, name, bytes } => {
                if let Some(old) = self.held.insert((kind, name), bytes) {
                    self.bytes -= old;
                    self.total.shrink(old);
                }
                self.bytes += bytes;
            }
            Change::Close { kind, name } => {
                if let Some(old) = self.held.remove(&(kind, name)) {
                    self.bytes -= old;
                    self.total.shrink(old);
                }
            }
        }
        assert!(self.held.len() <= self.max_count && self.bytes <= self.max_bytes);
        assert_eq!(self.bytes, self.total.bytes());
    }

    /// Forgets the prepared statement `name`, or every one (`None`), which DEALLOCATE or
    /// DISCARD ALL closes: the names that were held, for the caller to remove from pgwire's
    /// store.
    pub fn deallocate(&mut self, name: Option<&str>) -> Vec<String> {
        let names: Vec<String> = match name {
            Some(name) => vec![name.to_owned()],
            None => self.names(Kind::Statement),
        };
        for name in &names {
            self.apply(Change::Close {
                kind: Kind::Statement,
                name: name.clone(),
            });
        }
        names
    }

    /// Forgets every portal, which DISCARD ALL closes: their names, for the caller to
    /// remove from pgwire's store.
    pub fn close_portals(&mut self) -> Vec<String> {
        let names = self.names(Kind::Portal);
        for name in &names {
            self.apply(Change::Close {
                kind: Kind::Portal,
                name: name.clone(),
            });
        }
        names
    }

    fn names(&self, of: Kind) -> Vec<String> {
        self.held
            .keys()
            .filter(|(kind, _)| *kind == of)
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// Forgets `change`, which pgwire refused: gives back what it reserved.
    pub fn undo(&mut self, change: Change) {
        if let Change::Hold { bytes, .. } = change {
            self.total.shrink(bytes);
        }
        assert_eq!(self.bytes, self.total.bytes());
    }
}

/// What a bound parameter takes besides its bytes (its slot in the portal).
const PARAMETER_BYTES: usize = 32;

impl Named {
    /// What the statement `name` takes, as far as this session knows (0 for one it does
    /// not hold: pgwire refuses a Bind to it).
    fn statement_bytes(&self, name: &Option<String>) -> usize {
        match named(name) {
            None => self.unnamed_statement,
            Some(name) => self
                .held
                .get(&(Kind::Statement, name.to_owned()))
                .copied()
                .unwrap_or(0),
        }
    }
}

/// A name given by the client: the empty name is the unnamed statement or portal.
fn named(name: &Option<String>) -> Option<&str> {
    name.as_deref().filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgwire::messages::extendedquery::{Close, Parse};

    fn parse(name: &str, query: &str) -> PgWireFrontendMessage {
        PgWireFrontendMessage::Parse(Parse::new(
            Some(name.to_owned()),
            query.to_owned(),
            Vec::new(),
        ))
    }

    fn close(name: &str) -> PgWireFrontendMessage {
        PgWireFrontendMessage::Close(Close::new(
            TARGET_TYPE_BYTE_STATEMENT,
            Some(name.to_owned()),
        ))
    }

    fn limits(max_prepared: usize, max_bytes: usize, max_total: usize) -> Pg {
        Pg {
            max_prepared,
            max_prepared_bytes: max_bytes,
            max_prepared_bytes_total: max_total,
            ..Pg::default()
        }
    }

    fn hold(named: &mut Named, message: PgWireFrontendMessage) -> Result<(), PgWireError> {
        let change = named.check(&message)?;
        named.apply(change);
        Ok(())
    }

    #[test]
    fn a_session_holds_at_most_its_count_and_bytes() {
        let total = Admission::new(1 << 20);
        let mut named = Named::new(&limits(2, 100, 1 << 20), &total).unwrap();
        hold(&mut named, parse("a", "SELECT 1")).unwrap();
        hold(&mut named, parse("b", "SELECT 2")).unwrap();
        assert!(hold(&mut named, parse("c", "SELECT 3")).is_err());
        // Replacing one of the same name, or the unnamed one, holds nothing more.
        hold(&mut named, parse("b", "SELECT 22")).unwrap();
        hold(&mut named, parse("", &"x".repeat(1000))).unwrap();
        assert_eq!(total.bytes_in_flight(), "a".len() + 8 + "b".len() + 9);
        hold(&mut named, close("a")).unwrap();
        assert!(
            hold(&mut named, parse("c", &"x".repeat(99))).is_err(),
            "over 100 bytes"
        );
        hold(&mut named, parse("c", "SELECT 3")).unwrap();
        let mut closed = named.deallocate(None);
        closed.sort();
        assert_eq!(closed, ["b", "c"]);
        assert_eq!(total.bytes_in_flight(), 0);
        hold(&mut named, parse("d", "SELECT 4")).unwrap();
        drop(named);
        assert_eq!(
            total.bytes_in_flight(),
            0,
            "a closed session gives its bytes back"
        );
    }

    #[test]
    fn sessions_together_hold_at_most_the_total_and_refusals_give_back() {
        let total = Admission::new(150);
        let limits = limits(1000, 100, 150);
        let (mut one, mut two) = (
            Named::new(&limits, &total).unwrap(),
            Named::new(&limits, &total).unwrap(),
        );
        hold(&mut one, parse("a", &"x".repeat(90))).unwrap();
        let change = two.check(&parse("a", &"x".repeat(90)));
        assert!(change.is_err(), "the total would be crossed");
        let change = two.check(&parse("a", &"x".repeat(40))).unwrap();
        two.undo(change);
        assert_eq!(total.bytes_in_flight(), 91);
    }
}
