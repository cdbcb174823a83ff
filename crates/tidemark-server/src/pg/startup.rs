//! A connection's start: with a read token configured the password is a token (the read or
//! the write one; only the write token's sessions may `INSERT` and `COPY`); without one,
//! reads are open, as over HTTP, and nothing is asked (writes are then open only where no
//! write token is configured either). Compared as every transport compares
//! tokens ([`crate::auth::token_matches`]), in time independent of where they differ.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{Sink, SinkExt};
use pgwire::api::auth::{
    finish_authentication, protocol_negotiation, save_startup_parameters_to_metadata,
    DefaultServerParameterProvider, StartupHandler,
};
use pgwire::api::RandomPidSecretKeyGenerator;
use pgwire::api::{ClientInfo, PgWireConnectionState, PidSecretKeyGenerator};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::startup::Authentication;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use super::errors::fatal;
use super::slots::Slots;
use crate::auth::token_matches;
use crate::config::Auth;
use tidemark_sql::session;

/// Whether a session may write (`INSERT`, `COPY ... FROM STDIN`): it connected with the write
/// token as its password, or no token is configured. Kept in its session extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MayWrite(pub bool);

pub struct Startup {
    auth: Auth,
    /// The server has TLS: a client that did not ask for it is refused (its password would
    /// cross the network in the clear).
    tls_only: bool,
    parameters: DefaultServerParameterProvider,
    keys: RandomPidSecretKeyGenerator,
    /// An authenticated connection takes a session slot, kept in its session extensions
    /// (where the connection loop sees that it is authenticated) until it closes.
    slots: Arc<Slots>,
}

impl Startup {
    pub fn new(auth: Auth, tls_only: bool, slots: Arc<Slots>) -> Startup {
        let mut parameters = DefaultServerParameterProvider::default();
        // Clients read the major version to pick their catalog queries: PostgreSQL 16's.
        parameters.server_version = session::server_version();
        Startup {
            auth,
            tls_only,
            parameters,
            keys: RandomPidSecretKeyGenerator::default(),
            slots,
        }
    }

    /// What `SHOW name` answers: the settings SQL's `current_setting` reads, which the
    /// parameters told on connect agree with (a test checks).
    pub fn parameter(&self, name: &str) -> Option<String> {
        session::setting(name)
    }

    async fn finish<C>(&self, client: &mut C, may_write: MayWrite) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = self.slots.session().ok_or_else(|| {
            fatal(
                "53300",
                "sorry, too many clients already (pg.max_connections)",
            )
        })?;
        client.session_extensions().insert(session);
        client.session_extensions().insert(may_write);
        let (pid, secret) = self.keys.generate(client);
        client.set_pid_and_secret_key(pid, secret);
        finish_authentication(client, &self.parameters).await
    }
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                if self.tls_only && !client.is_secure() {
                    return Err(fatal(
                        "28000",
                        "this server takes TLS connections only: connect with sslmode=require \
                         (or verify-full)",
                    ));
                }
                if self.auth.read_token.is_none() {
                    // Nothing asked: writes are open only where no token is configured.
                    let may_write = MayWrite(!self.auth.is_enabled());
                    return self.finish(client, may_write).await;
                }
                client.set_state(PgWireConnectionState::AuthenticationInProgress);
                client
                    .send(PgWireBackendMessage::Authentication(
                        Authentication::CleartextPassword,
                    ))
                    .await?;
            }
            PgWireFrontendMessage::PasswordMessageFamily(password)
                if self.auth.read_token.is_some()
                    && matches!(
                        client.state(),
                        PgWireConnectionState::AuthenticationInProgress
                    ) =>
            {
                let password = password.into_password()?.password;
                let may_write = MayWrite(token_matches(&password, &self.auth.write_token));
                if may_write.0 || token_matches(&password, &self.auth.read_token) {
                    self.finish(client, may_write).await?;
                } else {
                    let user = client.metadata().get("user").cloned().unwrap_or_default();
                    return Err(PgWireError::InvalidPassword(user));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a client is told on connect is what `SHOW` and `current_setting` answer.
    #[test]
    fn connect_parameters_agree_with_the_settings() {
        let startup = Startup::new(Auth::default(), false, Slots::new(1, 1));
        let p = &startup.parameters;
        let on_off = |on: bool| if on { "on" } else { "off" }.to_string();
        for (name, told) in [
            ("server_version", p.server_version.clone()),
            ("server_encoding", p.server_encoding.clone()),
            ("datestyle", p.date_style.clone()),
            ("timezone", p.time_zone.clone()),
            ("intervalstyle", p.interval_style.clone()),
            ("integer_datetimes", on_off(p.integer_datetimes)),
            (
                "standard_conforming_strings",
                on_off(p.standard_conforming_strings),
            ),
            ("search_path", p.search_path.clone()),
        ] {
            assert_eq!(startup.parameter(name), Some(told), "{name}");
        }
    }
}
