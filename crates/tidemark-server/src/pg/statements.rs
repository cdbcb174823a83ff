//! Statements over both query protocols: the simple one (text, possibly several statements)
//! and the extended one (parse, bind with parameters, describe, execute). Session
//! statements get their answers here; queries go to [`tidemark_sql`] on the query runtime
//! and come back as PostgreSQL rows, written by arrow-pg from the Arrow batches.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use async_trait::async_trait;
use futures::{stream, Sink, SinkExt, StreamExt};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DataRowEncoder, DescribePortalResponse, DescribeStatementResponse, FieldInfo, QueryResponse,
    Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, Type};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;
use pgwire::messages::PgWireBackendMessage;
use tidemark_sql::bounds::one_statement;
use tidemark_sql::params::{self, Param};
use tidemark_sql::session::{session_statement_of, SessionStatement};
use tidemark_sql::write::{write_of_statement, Write};
use tidemark_sql::{SqlError, SqlOptions, Stop};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::copy;
use super::errors::{from_sql, from_write, user_error};
use super::named::Named;
use super::params::decode_all;
use super::startup::{MayWrite, Startup};
use super::times;
use super::transaction;
use crate::metrics::Protocol;
use crate::sql_write;
use crate::state::{AppState, Namespace};

/// Batches of rows encoded and waiting for the connection.
const CHUNKS_AHEAD: usize = 2;

/// A statement as parsed: session statements are answered here, queries by SQL.
#[derive(Debug, Clone)]
pub struct Prepared {
    sql: String,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Session(SessionStatement),
    /// A query taking this many parameters.
    Query(usize),
    /// An `INSERT` taking this many parameters.
    Insert(usize),
    /// `COPY ... FROM STDIN`: its data follows ([`super::copy`]).
    CopyIn,
}

impl Prepared {
    /// A statement of the simple protocol: no parameters to count.
    fn simple(sql: &str) -> Prepared {
        // Parsed once to tell its kind; a query is parsed again where it is planned.
        let kind = match one_statement(sql) {
            None => Kind::Query(0),
            Some(statement) => match write_of_statement(&statement) {
                Some(Write::Insert) => Kind::Insert(0),
                Some(Write::CopyFromStdin) => Kind::CopyIn,
                None => session_statement_of(statement).map_or(Kind::Query(0), Kind::Session),
            },
        };
        Prepared {
            sql: sql.to_owned(),
            kind,
        }
    }

    /// How many parameters the statement takes.
    fn parameters(&self) -> usize {
        match self.kind {
            Kind::Query(count) | Kind::Insert(count) => count,
            Kind::Session(_) | Kind::CopyIn => 0,
        }
    }

    /// A statement of the extended protocol, with the parameters it takes.
    fn extended(sql: &str) -> Result<Prepared, SqlError> {
        let mut prepared = Prepared::simple(sql);
        if let Kind::Query(count) | Kind::Insert(count) = &mut prepared.kind {
            *count = params::count(sql)?;
        }
        Ok(prepared)
    }
}

pub struct Parser;

#[async_trait]
impl QueryParser for Parser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        Prepared::extended(sql).map(Some).map_err(from_sql)
    }

    fn get_parameter_types(&self, statement: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(vec![Type::TEXT; statement.parameters()])
    }

    /// Unused: [`Backend`] describes statements itself (planning is async).
    fn get_result_schema(
        &self,
        _statement: &Prepared,
        _format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        Err(user_error("XX000", "describing needs the query runtime"))
    }
}

/// Both query handlers of every connection.
pub struct Backend {
    state: AppState,
    startup: Arc<Startup>,
    parser: Arc<Parser>,
}

impl Backend {
    pub fn new(state: AppState, startup: Arc<Startup>) -> Backend {
        Backend {
            state,
            startup,
            parser: Arc::new(Parser),
        }
    }

    /// Runs one statement of `client`'s session; counted in
    /// `tidemark_protocol_*{protocol="postgresql"}`.
    async fn execute<C>(
        &self,
        client: &mut C,
        prepared: &Prepared,
        params: &[Param],
        format: &Format,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // A statement means no COPY is under way any more (pgwire ends one on any other
        // message): what an unfinished one held is let go.
        copy::abandon(client);
        let answer = match &prepared.kind {
            Kind::Session(session) => self.session(client, session, format).await,
            Kind::Query(_) => match bound(prepared, params) {
                Ok(sql) => self.query(sql, format.clone()).await,
                Err(e) => Err(e),
            },
            Kind::Insert(_) => match may_write(client, "INSERT").and(bound(prepared, params)) {
                Ok(sql) => self.insert(client, sql).await,
                Err(e) => Err(e),
            },
            Kind::CopyIn => may_write(client, "COPY ... FROM STDIN")
                .and_then(|()| copy::begin(&self.state, client, &prepared.sql)),
        };
        let metrics = self.state.metrics();
        match &answer {
            Ok(_) => metrics.protocol_answered(Protocol::Postgres),
            Err(_) => metrics.protocol_refused(Protocol::Postgres),
        }
        answer
    }

    async fn session<C>(
        &self,
        client: &mut C,
        session: &SessionStatement,
        format: &Format,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        Ok(match session {
            SessionStatement::Begin => {
                transaction::begin(client);
                Response::TransactionStart(Tag::new("BEGIN"))
            }
            SessionStatement::Commit => {
                transaction::end(client, false);
                Response::TransactionEnd(Tag::new("COMMIT"))
            }
            SessionStatement::Rollback => {
                if let Some(warning) = transaction::end(client, true) {
                    client
                        .send(PgWireBackendMessage::NoticeResponse(warning))
                        .await?;
                }
                Response::TransactionEnd(Tag::new("ROLLBACK"))
            }
            SessionStatement::Set(tag) => Response::Execution(Tag::new(tag)),
            SessionStatement::Savepoint(tag) => Response::Execution(Tag::new(tag)),
            SessionStatement::Reset => Response::Execution(Tag::new("DISCARD ALL")),
            SessionStatement::Deallocate(_) => Response::Execution(Tag::new("DEALLOCATE")),
            SessionStatement::Show(name) => {
                let value = self.startup.parameter(name).ok_or_else(|| {
                    user_error(
                        "42704",
                        format!("unrecognized configuration parameter \"{name}\""),
                    )
                })?;
                let fields = Arc::new(vec![show_field(name, format)]);
                let mut row = DataRowEncoder::new(fields.clone());
                row.encode_field(&value)?;
                let rows = stream::iter([Ok(row.take_row())]);
                Response::Query(QueryResponse::new(fields, rows))
            }
        })
    }

    /// Starts `sql` on the query runtime and answers with its rows as they come. The query
    /// stops at `limits.query_timeout_ms` or when the client stops reading.
    async fn query(&self, sql: String, format: Format) -> PgWireResult<Response> {
        let runtime = query_runtime()?;
        let (head_tx, head_rx) = oneshot::channel();
        let (rows_tx, rows_rx) = mpsc::channel(CHUNKS_AHEAD);
        let stop = Stop::after(self.state.config().limits.query_timeout());
        // Dropping this future or the rows (the session ended) stops the query, however busy.
        let cancel = stop.cancel_on_drop();
        runtime.spawn(run(self.state.clone(), sql, format, stop, head_tx, rows_tx));
        let fields = head_rx
            .await
            .map_err(|_| user_error("XX000", "the query stopped before its answer began"))??;
        let rows = stream::unfold((rows_rx, cancel), |(mut rx, cancel)| async move {
            rx.recv().await.map(|chunk| (chunk, (rx, cancel)))
        })
        .flat_map(|chunk: PgWireResult<Vec<DataRow>>| match chunk {
            Ok(rows) => stream::iter(rows.into_iter().map(Ok).collect::<Vec<_>>()),
            Err(e) => stream::iter(vec![Err(e)]),
        });
        Ok(Response::Query(QueryResponse::new(fields, rows)))
    }

    /// Runs the `INSERT` `sql` and appends its rows: `INSERT 0 n` once they are durable.
    async fn insert<C: ClientInfo>(&self, client: &C, sql: String) -> PgWireResult<Response> {
        let ack = sql_write::insert(&self.state, sql)
            .await
            .map_err(from_write)?;
        let events = ack.map_or(0, |ack| ack.events as usize);
        transaction::stored(client, events as u64);
        Ok(Response::Execution(
            Tag::new("INSERT").with_oid(0).with_rows(events),
        ))
    }

    /// The columns `prepared` answers with, planned with `params` but not run.
    async fn describe(
        &self,
        prepared: &Prepared,
        params: &[Param],
        format: &Format,
    ) -> PgWireResult<Vec<FieldInfo>> {
        match &prepared.kind {
            Kind::Session(SessionStatement::Show(name)) => Ok(vec![show_field(name, format)]),
            Kind::Session(_) | Kind::Insert(_) | Kind::CopyIn => Ok(Vec::new()),
            Kind::Query(_) => {
                let sql = bound(prepared, params)?;
                let runtime = query_runtime()?;
                let state = self.state.clone();
                let schema = runtime
                    .spawn(async move {
                        let db = state.db(Namespace::Replicated);
                        tidemark_sql::describe(&db, &sql, options(&state)).await
                    })
                    .await
                    .map_err(|e| user_error("XX000", format!("describing the statement: {e}")))?
                    .map_err(from_sql)?;
                arrow_schema_to_pg_fields(&schema, format, None)
            }
        }
    }
}

fn query_runtime() -> PgWireResult<&'static tokio::runtime::Runtime> {
    tidemark_sql::runtime::query_runtime()
        .map_err(|e| user_error("XX000", format!("starting the query threads: {e}")))
}

/// Closes what `DEALLOCATE` or `DISCARD ALL` close: prepared statements (and, for DISCARD
/// ALL, portals), in pgwire's store and in the session's count ([`Named`]).
fn close_statements<C>(client: &C, prepared: &Prepared) -> PgWireResult<()>
where
    C: ClientInfo + ClientPortalStore,
    C::PortalStore: PortalStore,
{
    let name = match &prepared.kind {
        Kind::Session(SessionStatement::Deallocate(name)) => name.as_deref(),
        Kind::Session(SessionStatement::Reset) => None,
        _ => return Ok(()),
    };
    if let Some(name) = name {
        if client.portal_store().get_statement(name).is_none() {
            return Err(user_error(
                "26000",
                format!("prepared statement \"{name}\" does not exist"),
            ));
        }
    }
    let discard_all = matches!(prepared.kind, Kind::Session(SessionStatement::Reset));
    let (statements, portals) = match client.session_extensions().get::<Mutex<Named>>() {
        Some(named) => {
            let mut named = named.lock().unwrap_or_else(PoisonError::into_inner);
            let portals = if discard_all {
                named.close_portals()
            } else {
                Vec::new()
            };
            (named.deallocate(name), portals)
        }
        None => (name.map(str::to_owned).into_iter().collect(), Vec::new()),
    };
    for name in statements {
        client.portal_store().rm_statement(&name);
    }
    for name in portals {
        client.portal_store().rm_portal(&name);
    }
    Ok(())
}

/// Refuses `what` unless the session may write ([`MayWrite`]).
fn may_write<C: ClientInfo>(client: &C, what: &str) -> PgWireResult<()> {
    let may = client
        .session_extensions()
        .get::<MayWrite>()
        .is_some_and(|may| may.0);
    if may {
        return Ok(());
    }
    Err(user_error(
        "42501",
        format!(
            "{what} needs the write token: connect with it as the password (sessions that \
             connected with the read token, or with none where the server asks none, only read)"
        ),
    ))
}

/// The one column of `SHOW name`.
fn show_field(name: &str, format: &Format) -> FieldInfo {
    FieldInfo::new(
        name.to_owned(),
        None,
        None,
        Type::TEXT,
        format.format_for(0),
    )
}

/// The statement's text with its parameters in place.
fn bound(prepared: &Prepared, params: &[Param]) -> PgWireResult<String> {
    if params.is_empty() {
        return Ok(prepared.sql.clone());
    }
    params::bind(&prepared.sql, params).map_err(from_sql)
}

fn options(state: &AppState) -> SqlOptions {
    state.sql_options()
}

/// Runs `sql` and sends its rows, encoded, through `rows` (on the query runtime: neither the
/// query nor the encoding takes the threads that take appends).
async fn run(
    state: AppState,
    sql: String,
    format: Format,
    stop: Stop,
    mut head: oneshot::Sender<PgWireResult<Arc<Vec<FieldInfo>>>>,
    rows: mpsc::Sender<PgWireResult<Vec<DataRow>>>,
) {
    let timeout = state.config().limits.query_timeout();
    let deadline = Instant::now() + timeout;
    let db = state.db(Namespace::Replicated);
    let started = tokio::select! {
        () = head.closed() => return,
        started = tokio::time::timeout_at(
            deadline,
            tidemark_sql::query_with(state.plans(), &db, &sql, SqlOptions { stop, ..options(&state) }),
        ) => started,
    };
    let mut batches = match started {
        Ok(Ok(batches)) => batches,
        Ok(Err(e)) => {
            let _ = head.send(Err(from_sql(e)));
            return;
        }
        Err(_) => {
            let _ = head.send(Err(from_sql(SqlError::Timeout(timeout))));
            return;
        }
    };
    let fields = match arrow_schema_to_pg_fields(&batches.schema(), &format, None) {
        Ok(fields) => Arc::new(fields),
        Err(e) => {
            let _ = head.send(Err(e));
            return;
        }
    };
    if head.send(Ok(fields.clone())).is_err() {
        return;
    }
    loop {
        let next = tokio::select! {
            // The client left: dropping the stream stops the query's work.
            () = rows.closed() => return,
            next = tokio::time::timeout_at(deadline, batches.next()) => next,
        };
        let chunk = match next {
            Err(_) => Err(from_sql(SqlError::Timeout(timeout))),
            Ok(None) => return,
            Ok(Some(Err(e))) => Err(from_sql(e.into())),
            Ok(Some(Ok(batch))) => times::zoned_times_as_text(batch, &fields)
                .and_then(|batch| encode_recordbatch(fields.clone(), batch).collect()),
        };
        let failed = chunk.is_err();
        // A portal suspended by its client (Execute with a row limit) waits here: it holds
        // its query only until the deadline, like any other.
        match tokio::time::timeout_at(deadline, rows.send(chunk)).await {
            Ok(Ok(())) if !failed => {}
            _ => return,
        }
    }
}

#[async_trait]
impl SimpleQueryHandler for Backend {
    async fn do_query<C>(&self, client: &mut C, sql: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statements = tidemark_sql::statements(sql).map_err(|e| {
            self.state.metrics().protocol_refused(Protocol::Postgres);
            from_sql(e)
        })?;
        let mut responses = Vec::with_capacity(statements.len());
        // As PostgreSQL: the statements run in order, and the first error ends the rest.
        let count = statements.len();
        for (i, text) in statements.into_iter().enumerate() {
            let last = i + 1 == count;
            let prepared = Prepared::simple(&text);
            let answer = match close_statements(client, &prepared) {
                // The copy data that follows is for the last statement only.
                Ok(()) if matches!(prepared.kind, Kind::CopyIn) && !last => Err(user_error(
                    "0A000",
                    "COPY ... FROM STDIN must be the last statement of its message",
                )),
                Ok(()) => {
                    self.execute(client, &prepared, &[], &Format::UnifiedText)
                        .await
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok(response) => responses.push(response),
                Err(PgWireError::UserError(info)) => {
                    responses.push(Response::Error(info));
                    break;
                }
                Err(other) => return Err(other),
            }
        }
        Ok(responses)
    }
}

#[async_trait]
impl ExtendedQueryHandler for Backend {
    type Statement = Prepared;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let params = decode_all(portal, portal.statement.statement.parameters())?;
        close_statements(client, &portal.statement.statement)?;
        self.execute(
            client,
            &portal.statement.statement,
            &params,
            &portal.result_column_format,
        )
        .await
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        target: &StoredStatement<Prepared>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let prepared = &target.statement;
        let count = prepared.parameters();
        // The types the client declared, text where it left them to the server.
        let types = (0..count.max(target.parameter_types.len()))
            .map(|i| {
                target
                    .parameter_types
                    .get(i)
                    .cloned()
                    .flatten()
                    .unwrap_or(Type::TEXT)
            })
            .collect();
        // Before Bind no values exist: the columns are those of the statement with NULLs.
        let nulls = vec![Param::Null; count];
        let fields = self
            .describe(prepared, &nulls, &Format::UnifiedText)
            .await?;
        Ok(DescribeStatementResponse::new(types, fields))
    }

    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        portal: &Portal<Prepared>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let params = decode_all(portal, portal.statement.statement.parameters())?;
        let fields = self
            .describe(
                &portal.statement.statement,
                &params,
                &portal.result_column_format,
            )
            .await?;
        Ok(DescribePortalResponse::new(fields))
    }
}
