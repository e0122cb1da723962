//! Reading manifest files safely: only regular files, each bounded in size; directories walked
//! once per real path (symlink cycles end the walk, they do not loop it); YAML whose nesting is
//! deeper than any manifest needs is refused before the parser sees it (the parser is quadratic
//! in depth: 100 000 levels took 40-55 s).

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest manifest file read (the API server's whole-request limit is 3 MiB; this leaves room
/// for multi-document files of many objects).
pub const MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Deepest YAML nesting accepted: block indentation columns plus open flow brackets. Kubernetes
/// objects nest a few dozen levels; the API server's JSON decoder stops at 10 000.
pub const MAX_NESTING: usize = 256;
/// Directory levels walked below a `-f` directory.
pub const MAX_DIRECTORY_DEPTH: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a regular file or directory (devices, pipes and sockets are not read)")]
    NotRegular { path: String },
    #[error("{path}: larger than the {limit} bytes a manifest file may have")]
    TooLarge { path: String, limit: u64 },
    #[error("{path}: more than {MAX_DIRECTORY_DEPTH} directory levels")]
    TooDeep { path: String },
    #[error("{path}: line {line}: nesting deeper than {MAX_NESTING} levels")]
    Nesting { path: String, line: usize },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> InputError + '_ {
    move |source| InputError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The manifest files under `path`: the file itself, or the `.yaml`/`.yml`/`.json` files of a
/// directory, recursively, in name order. A directory reached twice (a symlink cycle, or two
/// links to one directory) is walked once.
pub fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, InputError> {
    let mut out = Vec::new();
    let mut visited = BTreeSet::new();
    collect(path, 0, true, &mut visited, &mut out)?;
    Ok(out)
}

fn collect(
    path: &Path,
    depth: usize,
    named: bool,
    visited: &mut BTreeSet<PathBuf>,
    out: &mut Vec<PathBuf>,
) -> Result<(), InputError> {
    // `metadata` follows symlinks: a link to a file is read as that file.
    let metadata = std::fs::metadata(path).map_err(io_error(path))?;
    if metadata.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    if !metadata.is_dir() {
        // Named on the command line it is an error; met in a directory it is not a manifest.
        return if named {
            Err(InputError::NotRegular {
                path: path.display().to_string(),
            })
        } else {
            Ok(())
        };
    }
    if depth > MAX_DIRECTORY_DEPTH {
        return Err(InputError::TooDeep {
            path: path.display().to_string(),
        });
    }
    let real = std::fs::canonicalize(path).map_err(io_error(path))?;
    if !visited.insert(real) {
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(io_error(path))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for entry in entries {
        let is_manifest = entry
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if is_manifest || entry.is_dir() {
            collect(&entry, depth + 1, false, visited, out)?;
        }
    }
    Ok(())
}

/// Reads a regular file of at most [`MAX_FILE_BYTES`] as UTF-8.
pub fn read_manifest(path: &Path) -> Result<String, InputError> {
    read_bounded(path, MAX_FILE_BYTES)
}

fn read_bounded(path: &Path, limit: u64) -> Result<String, InputError> {
    let file = std::fs::File::open(path).map_err(io_error(path))?;
    let metadata = file.metadata().map_err(io_error(path))?;
    if !metadata.is_file() {
        return Err(InputError::NotRegular {
            path: path.display().to_string(),
        });
    }
    let too_large = || InputError::TooLarge {
        path: path.display().to_string(),
        limit,
    };
    if metadata.len() > limit {
        return Err(too_large());
    }
    // The size can change after the check (a growing file): the read itself is bounded too.
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(io_error(path))?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|e| InputError::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

/// Refuses YAML nested deeper than [`MAX_NESTING`], in one pass without parsing. Block
/// nesting needs at least one column of indentation (or a `- ` entry) per level, so the column
/// where a line's content starts bounds its block depth; flow nesting is counted by brackets
/// outside quotes and comments. Block scalars are skipped (their indentation is text).
pub fn check_nesting(path: &str, text: &str) -> Result<(), InputError> {
    let mut flow_depth: usize = 0;
    let mut block_scalar_indent: Option<usize> = None;
    for (number, line) in text.lines().enumerate() {
        let nesting = |_| InputError::Nesting {
            path: path.to_string(),
            line: number + 1,
        };
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        if let Some(parent) = block_scalar_indent {
            if line.trim().is_empty() || indent > parent {
                continue;
            }
            block_scalar_indent = None;
        }
        let body = &line[indent..];
        // `- - - x`: each compact sequence entry is a level.
        let mut column = indent;
        let mut rest = body;
        while let Some(after) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("-\t")) {
            column += 2;
            rest = after.trim_start_matches([' ', '\t']);
        }
        if column > MAX_NESTING {
            return Err(nesting(()));
        }
        let (quote, depth, deepest) = scan_flow(rest, flow_depth);
        flow_depth = depth;
        if deepest + column > MAX_NESTING {
            return Err(nesting(()));
        }
        if quote.is_none() && ends_with_block_scalar_header(rest) {
            block_scalar_indent = Some(indent);
        }
    }
    Ok(())
}

/// Counts `[`/`{` and `]`/`}` outside quotes and comments; returns the quote still open at the
/// end of the line (a multi-line quoted scalar), the flow depth there and the deepest reached.
fn scan_flow(line: &str, mut depth: usize) -> (Option<char>, usize, usize) {
    let mut deepest = depth;
    let mut quote: Option<char> = None;
    let mut previous = ' ';
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some('"') if c == '\\' => {
                chars.next();
            }
            Some(q) if c == q => {
                if q == '\'' && chars.peek() == Some(&'\'') {
                    chars.next();
                } else {
                    quote = None;
                }
            }
            Some(_) => {}
            None => match c {
                '#' if previous == ' ' || previous == '\t' => break,
                '"' | '\'' => quote = Some(c),
                '[' | '{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        previous = c;
    }
    (quote, depth, deepest)
}

/// `key: |`, `key: >-`, `- |2` …: the following more-indented lines are text.
fn ends_with_block_scalar_header(line: &str) -> bool {
    let code = line.split(" #").next().unwrap_or(line).trim_end();
    let Some(last) = code.split([' ', '\t']).next_back() else {
        return false;
    };
    let mut chars = last.chars();
    matches!(chars.next(), Some('|' | '>'))
        && chars.all(|c| matches!(c, '+' | '-') || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_manifests_pass_the_nesting_check() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {a: b}}\nspec:\n  containers:\n    - name: c\n      args: [\"[\", '{{']\n      command:\n        - sh\n  script: |\n                                                                                                                                                                                                                                                                      deeply indented text is fine\n";
        check_nesting("ok.yaml", text).unwrap();
    }

    #[test]
    fn deep_flow_nesting_is_refused_before_parsing() {
        let text = format!("a: {}1{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let started = std::time::Instant::now();
        let err = check_nesting("deep.yaml", &text).unwrap_err().to_string();
        assert!(
            err.contains("deep.yaml: line 1: nesting deeper than 256"),
            "{err}"
        );
        // One linear pass: far from the parser's quadratic tens of seconds.
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn deep_block_nesting_is_refused() {
        let mut text = String::new();
        for level in 0..300 {
            text.push_str(&" ".repeat(level));
            text.push_str(&format!("k{level}:\n"));
        }
        let err = check_nesting("block.yaml", &text).unwrap_err().to_string();
        assert!(err.contains("line 258"), "{err}");
        let sequences = format!("{}x\n", "- ".repeat(200));
        assert!(check_nesting("seq.yaml", &sequences).is_err());
    }

    #[test]
    fn flow_nesting_spread_over_lines_is_counted() {
        let text = "a:\n".to_string() + &"  [\n".repeat(300);
        assert!(check_nesting("lines.yaml", &text).is_err());
    }

    #[test]
    fn brackets_in_quotes_and_comments_do_not_count() {
        let text = format!(
            "a: \"{}\"\nb: '{}'\nc: 1 # {}\n",
            "[".repeat(1000),
            "{".repeat(1000),
            "[".repeat(1000)
        );
        check_nesting("quoted.yaml", &text).unwrap();
    }

    #[test]
    fn symlink_cycles_are_walked_once() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("pool.yaml"), "a: 1\n").unwrap();
        std::os::unix::fs::symlink(dir.path(), sub.join("back")).unwrap();
        std::os::unix::fs::symlink(&sub, dir.path().join("again")).unwrap();
        let files = manifest_files(dir.path()).unwrap();
        assert_eq!(files.len(), 1, "{files:?}");
    }

    #[test]
    fn devices_and_pipes_are_not_read() {
        let err = manifest_files(Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(err, InputError::NotRegular { .. }), "{err}");
        assert!(err.to_string().contains("/dev/zero: not a regular file"));
        let err = read_manifest(Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(err, InputError::NotRegular { .. }), "{err}");
        // A device inside a directory is simply not a manifest.
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.yaml")).unwrap();
        assert!(manifest_files(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn files_above_the_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.yaml");
        std::fs::write(&path, vec![b'a'; 2048]).unwrap();
        let err = read_bounded(&path, 1024).unwrap_err().to_string();
        assert!(
            err.contains("big.yaml: larger than the 1024 bytes"),
            "{err}"
        );
        assert_eq!(read_bounded(&path, 4096).unwrap().len(), 2048);
    }
}
