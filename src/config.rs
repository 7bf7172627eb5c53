//! Where the broker keeps its files and how the owner token is found: the same
//! rules for `serve` and for the client commands.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// `$XDG_DATA_HOME/loopx`, else `~/.local/share/loopx`.
pub fn default_data_dir() -> PathBuf {
    match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(xdg) => PathBuf::from(xdg).join("loopx"),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            PathBuf::from(home).join(".local/share/loopx")
        }
    }
}

/// Creates the data dir (mode 0700) if needed and tightens its mode.
pub fn prepare_data_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Where a token came from, for messages (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    Env,
    File(PathBuf),
    /// A token file this start just created (the data dir's first start).
    Created(PathBuf),
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::Env => f.write_str("LOOPX_TOKEN"),
            TokenSource::File(path) | TokenSource::Created(path) => {
                write!(f, "{}", path.display())
            }
        }
    }
}

/// The owner token, in the contract's order: `LOOPX_TOKEN`; else the token
/// file; else `<data dir>/owner.token`, created with a random token (mode
/// 0600) when `create` is set and it does not exist.
pub fn owner_token(
    token_file: Option<&Path>,
    data_dir: &Path,
    create: bool,
) -> Result<(String, TokenSource), String> {
    if let Some(token) = std::env::var("LOOPX_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Ok((token.trim().to_owned(), TokenSource::Env));
    }
    let path = match token_file {
        Some(file) => file.to_owned(),
        None => data_dir.join("owner.token"),
    };
    match std::fs::read_to_string(&path) {
        Ok(token) if !token.trim().is_empty() => {
            Ok((token.trim().to_owned(), TokenSource::File(path)))
        }
        Ok(_) => Err(format!("the token file {} is empty", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create && token_file.is_none() => {
            let token = new_token();
            write_private(&path, &token)
                .map_err(|e| format!("cannot create the token file {}: {e}", path.display()))?;
            Ok((token, TokenSource::Created(path)))
        }
        Err(e) => Err(format!(
            "cannot read the token file {}: {e}",
            path.display()
        )),
    }
}

/// 32 random bytes, hex.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system provides randomness");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{contents}")?;
    file.sync_all()
}

/// A secret from a flag or the environment; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A database URL from a flag or the environment. `Debug` shows where it
/// points but never its password (in the user info or a `password=`
/// parameter): a URL is printed whole by anything that debug-prints the
/// arguments.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(pub String);

impl std::str::FromStr for DatabaseUrl {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(DatabaseUrl(s.to_owned()))
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match redacted_url(&self.0) {
            Some(url) => write!(f, "DatabaseUrl({url:?})"),
            None => f.write_str("DatabaseUrl(<not a URL, redacted>)"),
        }
    }
}

/// The URL with its password and any password parameter replaced; `None`
/// when it does not parse (then nothing of it may show).
fn redacted_url(url: &str) -> Option<String> {
    const HIDDEN: &str = "redacted";
    let mut url = url::Url::parse(url).ok()?;
    if url.password().is_some() {
        url.set_password(Some(HIDDEN)).ok()?;
    }
    // libpq's `password` and `sslpassword`.
    let secret = |name: &str| name.to_ascii_lowercase().contains("password");
    if url.query_pairs().any(|(name, _)| secret(&name)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if secret(&name) {
                    HIDDEN.into()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    Some(url.into())
}

#[cfg(test)]
mod tests {
    use super::DatabaseUrl;

    #[test]
    fn a_database_url_debug_prints_where_it_points_but_no_password() {
        let url = DatabaseUrl(
            "postgres://loopx:hunter2@db.internal:5432/loopx?sslmode=require&password=s3cret&sslpassword=k3y"
                .into(),
        );
        let shown = format!("{url:?}");
        for secret in ["hunter2", "s3cret", "k3y"] {
            assert!(!shown.contains(secret), "{shown} shows {secret}");
        }
        assert!(shown.contains("db.internal:5432/loopx"), "{shown}");
        assert!(shown.contains("sslmode=require"), "{shown}");
        let unparsable = format!("{:?}", DatabaseUrl("postgres://u:hunter2@[::1".into()));
        assert!(!unparsable.contains("hunter2"), "{unparsable}");
    }
}
