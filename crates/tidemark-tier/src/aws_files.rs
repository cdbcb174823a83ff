//! Credentials and region from the AWS shared files, as the AWS CLI and SDKs read them:
//! `~/.aws/credentials` (or `AWS_SHARED_CREDENTIALS_FILE`) and `~/.aws/config` (or
//! `AWS_CONFIG_FILE`), profile `AWS_PROFILE` or `default`.
//!
//! Why by hand: the files are a few `key = value` lines under `[section]` headers; the AWS
//! SDK's loader (`aws-config`) would bring a second HTTP stack and dozens of crates for
//! them, and `object_store` reads only the environment variables.

use std::path::PathBuf;

use crate::credentials::Credentials;

/// What the shared files say for one profile.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Profile {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
}

impl Profile {
    /// The profile named by the environment, read from the files it names (or the default
    /// files under `$HOME/.aws`). Files that are not there read as empty.
    pub fn from_environment() -> Profile {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let home = var("HOME").map(PathBuf::from);
        let file = |variable: &str, default: &str| {
            var(variable)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
        };
        let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".to_string());
        let read = |path: Option<PathBuf>| {
            path.and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default()
        };
        Profile::from_files(
            &read(file("AWS_SHARED_CREDENTIALS_FILE", "credentials")),
            &read(file("AWS_CONFIG_FILE", "config")),
            &profile,
        )
    }

    /// `profile` as `credentials` and `config` (the files' text) give it. The credentials
    /// file names sections `[name]`; the config file `[profile name]`, except `[default]`.
    pub fn from_files(credentials: &str, config: &str, profile: &str) -> Profile {
        let in_credentials = section(credentials, profile);
        let config_section = match profile {
            "default" => "default".to_string(),
            name => format!("profile {name}"),
        };
        let in_config = section(config, &config_section);
        let get = |entries: &[(String, String)], key: &str| {
            entries
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let either = |key: &str| get(&in_credentials, key).or_else(|| get(&in_config, key));
        Profile {
            access_key_id: either("aws_access_key_id"),
            secret_access_key: either("aws_secret_access_key"),
            session_token: either("aws_session_token"),
            region: get(&in_config, "region"),
        }
    }

    /// The access keys, when the profile has both.
    pub fn credentials(&self) -> Option<Credentials> {
        Some(Credentials {
            access_key_id: self.access_key_id.clone()?,
            secret_access_key: self.secret_access_key.clone()?,
            session_token: self.session_token.clone(),
        })
    }
}

/// The `key = value` entries of section `[name]` of an INI text, keys lower-cased; later
/// sections of the same name add to it. Comments (`#`, `;`) and other lines are skipped.
fn section(text: &str, name: &str) -> Vec<(String, String)> {
    let mut entries = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = header.split_whitespace().collect::<Vec<_>>().join(" ") == name;
            continue;
        }
        if let (true, Some((key, value))) = (inside, line.split_once('=')) {
            entries.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDENTIALS: &str = "\
# keys
[default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = default-secret

[archive]
AWS_Access_Key_Id=AKIAARCHIVE
aws_secret_access_key=archive/secret+with=equals
aws_session_token = token
";

    const CONFIG: &str = "\
[default]
region = eu-west-1
[profile archive]
region = us-west-2
; a comment
[profile keys-in-config]
aws_access_key_id = AKIACONFIG
aws_secret_access_key = config-secret
";

    #[test]
    fn a_profile_takes_its_keys_from_the_credentials_file_and_its_region_from_config() {
        let default = Profile::from_files(CREDENTIALS, CONFIG, "default");
        assert_eq!(default.access_key_id.as_deref(), Some("AKIADEFAULT"));
        assert_eq!(default.region.as_deref(), Some("eu-west-1"));
        assert_eq!(default.session_token, None);

        let archive = Profile::from_files(CREDENTIALS, CONFIG, "archive");
        assert_eq!(archive.access_key_id.as_deref(), Some("AKIAARCHIVE"));
        assert_eq!(
            archive.secret_access_key.as_deref(),
            Some("archive/secret+with=equals")
        );
        assert_eq!(archive.session_token.as_deref(), Some("token"));
        assert_eq!(archive.region.as_deref(), Some("us-west-2"));
        let credentials = archive.credentials().unwrap();
        assert!(
            !format!("{credentials:?}").contains("secret"),
            "never shown"
        );
    }

    #[test]
    fn keys_may_sit_in_the_config_file_and_a_missing_profile_has_none() {
        let in_config = Profile::from_files(CREDENTIALS, CONFIG, "keys-in-config");
        assert_eq!(in_config.access_key_id.as_deref(), Some("AKIACONFIG"));
        assert!(in_config.credentials().is_some());
        let missing = Profile::from_files(CREDENTIALS, CONFIG, "nobody");
        assert_eq!(missing, Profile::default());
        assert!(missing.credentials().is_none());
        assert_eq!(Profile::from_files("", "", "default"), Profile::default());
    }
}
