//! Tidemark's web console: one page that shows streams, ingest, consumers and the cluster
//! live and runs SQL with charts (docs/console.md). This crate owns the files the browser
//! loads, compiled into the binary so that no Node step is needed to build Tidemark and no
//! CDN at run time: the page, its scripts, and the libraries it vendors at exact versions
//! with their licenses (uPlot for charts, CodeMirror 5 for the SQL editor; `vendor.sh` says
//! where they come from and checks their digests).
//!
//! Must never know about: HTTP (the server maps [`asset`] to its routes), the API's
//! handlers. The page talks only to the public routes, so everything it shows is
//! scriptable too.

/// A file of the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    /// Its path under the console's root (`js/main.js`).
    pub path: &'static str,
    pub bytes: &'static [u8],
    pub media_type: &'static str,
}

impl Asset {
    /// Whether its content never changes under its path: the vendored libraries carry their
    /// version in their path, so a browser may keep them; the console's own files may change
    /// with any build, so a browser asks again.
    pub fn immutable(&self) -> bool {
        self.path.starts_with("vendor/")
    }
}

macro_rules! assets {
    ($($path:literal => $media_type:expr;)*) => {
        /// Every file.
        const ASSETS: &[Asset] = &[$(
            Asset {
                path: $path,
                bytes: include_bytes!(concat!("../assets/", $path)),
                media_type: $media_type,
            },
        )*];
    };
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

assets! {
    "index.html" => HTML;
    "console.css" => CSS;
    "js/api.js" => JS;
    "js/format.js" => JS;
    "js/metrics.js" => JS;
    "js/main.js" => JS;
    "js/streams.js" => JS;
    "js/query.js" => JS;
    "js/chart.js" => JS;
    "js/tail.js" => JS;
    "js/node.js" => JS;
    "js/agent.js" => JS;
    "js/poll.js" => JS;
    "vendor/uplot-1.6.32/uPlot.iife.min.js" => JS;
    "vendor/uplot-1.6.32/uPlot.min.css" => CSS;
    "vendor/uplot-1.6.32/LICENSE" => TEXT;
    "vendor/codemirror-5.65.21/codemirror.js" => JS;
    "vendor/codemirror-5.65.21/codemirror.css" => CSS;
    "vendor/codemirror-5.65.21/sql.js" => JS;
    "vendor/codemirror-5.65.21/show-hint.js" => JS;
    "vendor/codemirror-5.65.21/show-hint.css" => CSS;
    "vendor/codemirror-5.65.21/sql-hint.js" => JS;
    "vendor/codemirror-5.65.21/LICENSE" => TEXT;
}

/// The page itself (what `/` answers).
pub fn index() -> Asset {
    asset("index.html").expect("index.html is among the assets")
}

/// The file at `path` under the console's root (`js/main.js`), if there is one.
pub fn asset(path: &str) -> Option<Asset> {
    ASSETS.iter().find(|asset| asset.path == path).copied()
}

/// Every file.
pub fn all() -> impl Iterator<Item = Asset> {
    ASSETS.iter().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_has_the_media_type_of_its_extension() {
        for asset in ASSETS {
            let expected = match asset.path.rsplit_once('.').map(|(_, ext)| ext) {
                Some("html") => HTML,
                Some("js") => JS,
                Some("css") => CSS,
                _ => TEXT,
            };
            assert_eq!(asset.media_type, expected, "{}", asset.path);
            assert!(!asset.bytes.is_empty(), "{} is empty", asset.path);
        }
    }

    /// The files `path` loads: `/console/...` in the page, `./x.js` imported by a script.
    fn references(path: &str, text: &str) -> Vec<String> {
        text.split(['"', '\''])
            .filter_map(|piece| match piece.strip_prefix("/console/") {
                Some(under_root) => Some(under_root.to_string()),
                None if path.starts_with("js/") => {
                    piece.strip_prefix("./").map(|p| format!("js/{p}"))
                }
                None => None,
            })
            .filter(|p| p.ends_with(".js") || p.ends_with(".css"))
            .collect()
    }

    #[test]
    fn every_file_the_page_and_its_scripts_load_is_served() {
        // A file named in the page or imported by a script but left out of the table would
        // answer 404 only in a browser; this finds it here.
        let mut loaded = Vec::new();
        for file in ASSETS.iter().filter(|a| !a.immutable()) {
            let path = file.path;
            let text = std::str::from_utf8(file.bytes).expect("the console's files are UTF-8");
            for reference in references(path, text) {
                assert!(
                    asset(&reference).is_some(),
                    "{path} loads {reference}, which is not served"
                );
                loaded.push(reference);
            }
        }
        // Everything in the table is loaded by something (no dead file in the binary).
        for path in ASSETS.iter().map(|a| a.path) {
            let needed = path == "index.html"
                || path.ends_with("LICENSE")
                || loaded.iter().any(|l| l == path);
            assert!(needed, "{path} is served but nothing loads it");
        }
    }

    #[test]
    fn the_index_is_the_page_and_unknown_paths_are_none() {
        assert!(std::str::from_utf8(index().bytes).is_ok_and(|t| t.contains("<html")));
        assert_eq!(asset("nope.js"), None);
        assert_eq!(asset("../Cargo.toml"), None);
        assert_eq!(asset(""), None);
    }
}
