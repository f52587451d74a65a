//! `context.toml`: where meshctl finds the replicas and the operator's TLS identity. Found via
//! `--context FILE`, else `MESH_CONTEXT`, else `./.mesh/context.toml`; relative paths in it are
//! relative to the file's directory, so a context and its certificates move together.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The environment variable naming a context file.
pub const context_env: &str = "MESH_CONTEXT";
/// Where meshctl looks when neither `--context` nor `MESH_CONTEXT` is given.
pub const context_default_path: &str = ".mesh/context.toml";
/// Largest context file read, in bytes: a context lists a few replicas and three paths.
pub const context_file_bytes_max: u64 = 64 * 1024;
/// Most replicas a context may list.
pub const context_replicas_max: usize = 9;

/// Why no usable context was found.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error(
        "no context at {path} (from {source_name}); run `meshctl init` or `meshctl dev`, or pass --context FILE"
    )]
    Missing {
        path: PathBuf,
        source_name: &'static str,
    },
    #[error("cannot read context {path}: {source}; check its permissions")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "context {path} is not a meshctl context: {reason}; fix it or write a new one with `meshctl init`"
    )]
    Bad { path: PathBuf, reason: String },
}

impl ContextError {
    /// A context that points at nothing is a failure (1); a file that is wrong is bad input (2).
    pub fn exit_code(&self) -> u8 {
        match self {
            ContextError::Missing { .. } => super::exit_failed,
            ContextError::Read { .. } | ContextError::Bad { .. } => super::exit_bad_input,
        }
    }
}

/// `context.toml` as written on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextFile {
    /// Replica id → `ip:port`, all dialled at once (the client asks whichever answers first).
    pub replicas: BTreeMap<String, String>,
    pub tls: ContextTls,
}

/// The operator's identity: the mesh CA and a certificate naming `operator:<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A validated context: where it came from, replicas in the order to try, absolute TLS paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pub path: PathBuf,
    pub replicas: Vec<(u64, SocketAddr)>,
    pub tls: ContextTls,
}

/// Which file to use: the flag, else the environment, else the default path.
pub fn locate(flag: Option<&Path>, env: Option<&str>) -> (PathBuf, &'static str) {
    if let Some(path) = flag {
        return (path.to_path_buf(), "--context");
    }
    match env {
        Some(v) if !v.is_empty() => (PathBuf::from(v), context_env),
        _ => (PathBuf::from(context_default_path), "the default path"),
    }
}

/// Finds and loads the context for this run.
pub fn resolve(flag: Option<&Path>) -> Result<Context, ContextError> {
    let env = std::env::var(context_env).ok();
    let (path, source_name) = locate(flag, env.as_deref());
    load(&path, source_name)
}

/// Loads and validates the context at `path`.
pub fn load(path: &Path, source_name: &'static str) -> Result<Context, ContextError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ContextError::Missing {
                path: path.to_path_buf(),
                source_name,
            });
        }
        Err(source) => {
            return Err(ContextError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let bad = |reason: String| ContextError::Bad {
        path: path.to_path_buf(),
        reason,
    };
    if meta.len() > context_file_bytes_max {
        return Err(bad(format!(
            "it is {} bytes, over the limit of {context_file_bytes_max}",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|source| ContextError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let base = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    parse(&text, &base)
        .map_err(bad)
        .map(|(replicas, tls)| Context {
            path: path.to_path_buf(),
            replicas,
            tls,
        })
}

/// Parses context text; relative TLS paths resolve against `base`.
pub fn parse(text: &str, base: &Path) -> Result<(Vec<(u64, SocketAddr)>, ContextTls), String> {
    let raw: ContextFile = toml::from_str(text).map_err(|e| one_line(&e.to_string()))?;
    if raw.replicas.is_empty() {
        return Err("`replicas` is empty; list at least one `<id> = \"ip:port\"`".into());
    }
    if raw.replicas.len() > context_replicas_max {
        return Err(format!(
            "`replicas` lists {}, at most {context_replicas_max} are tried",
            raw.replicas.len()
        ));
    }
    let mut replicas = Vec::new();
    for (id, addr) in &raw.replicas {
        let id: u64 = id
            .parse()
            .map_err(|_| format!("replica id `{id}` is not a number"))?;
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| format!("replicas.{id} = `{addr}` is not an ip:port address"))?;
        replicas.push((id, addr));
    }
    replicas.sort();
    let resolve = |p: &PathBuf| {
        if p.is_absolute() {
            p.clone()
        } else {
            base.join(p)
        }
    };
    let tls = ContextTls {
        ca: resolve(&raw.tls.ca),
        cert: resolve(&raw.tls.cert),
        key: resolve(&raw.tls.key),
    };
    Ok((replicas, tls))
}

/// toml errors span several lines (a caret under the source); meshctl errors are one line.
fn one_line(text: &str) -> String {
    text.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('|') && !l.starts_with('^'))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_is_found_by_flag_then_env_then_default() {
        // Context resolution order: --context wins over MESH_CONTEXT, which wins over ./.mesh.
        let flag = Path::new("/a/context.toml");
        assert_eq!(locate(Some(flag), Some("/b")).0, flag);
        assert_eq!(locate(None, Some("/b")).0, PathBuf::from("/b"));
        assert_eq!(locate(None, None).0, PathBuf::from(context_default_path));
        assert_eq!(
            locate(None, Some("")).0,
            PathBuf::from(context_default_path)
        );
    }

    #[test]
    fn context_paths_resolve_against_its_directory_and_replicas_sort_by_id() {
        // Context files move with their certificates: relative paths are relative to the file.
        let text = "[replicas]\n2 = \"127.0.0.1:2\"\n1 = \"127.0.0.1:1\"\n[tls]\nca = \"ca.pem\"\ncert = \"/abs/c.pem\"\nkey = \"k.pem\"\n";
        let (replicas, tls) = parse(text, Path::new("/d")).expect("valid context");
        assert_eq!(replicas[0].0, 1);
        assert_eq!(replicas[1].0, 2);
        assert_eq!(tls.ca, PathBuf::from("/d/ca.pem"));
        assert_eq!(tls.cert, PathBuf::from("/abs/c.pem"));
    }

    #[test]
    fn bad_context_is_one_line_naming_the_problem() {
        // Every error is one line: a bad address, an empty list, unknown keys.
        let tls = "[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n";
        let cases = [
            format!("[replicas]\n1 = \"nowhere\"\n{tls}"),
            format!("[replicas]\n{tls}"),
            format!("[replicas]\nx = \"127.0.0.1:1\"\n{tls}"),
            format!("bogus = 1\n[replicas]\n1 = \"127.0.0.1:1\"\n{tls}"),
            "not toml [".to_string(),
        ];
        for text in cases {
            let e = parse(&text, Path::new("/")).expect_err("must be refused");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
