//! How `/metrics` is written for whoever scrapes it (meshd's and mesh-host's alike, decision
//! 0311): the classic Prometheus text format (0.0.4) unless the scraper's `Accept` header prefers
//! OpenMetrics, each written by prometheus-client from the same registry, so the two can never
//! say different things.

use prometheus_client::registry::Registry;

use crate::readonly_http::{classic_content_type, openmetrics_content_type};

/// The media type a scraper names to ask for OpenMetrics.
const openmetrics_media_type: &str = "application/openmetrics-text";
/// The media type of the classic text format.
const classic_media_type: &str = "text/plain";

/// Which text format one answer of `/metrics` is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The classic Prometheus text format, 0.0.4: `promtool check metrics` reads it, and so does
    /// every scraper that does not ask for anything else.
    Classic,
    /// OpenMetrics 1.0.0, for a scraper whose `Accept` prefers it (Prometheus 2.x asks for it
    /// first).
    OpenMetrics,
}

impl Format {
    /// The format for a request whose `Accept` header is `accept` (`None`: no header, or one that
    /// is not text): OpenMetrics when `application/openmetrics-text` is accepted with a quality
    /// above 0 and at least that of `text/plain` named explicitly; the classic format otherwise,
    /// including for `*/*` alone or no header at all.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Classic;
        };
        let mut openmetrics: f64 = 0.0;
        let mut classic: f64 = 0.0;
        for range in accept.split(',') {
            let (media, params) = match range.split_once(';') {
                Some((media, params)) => (media.trim(), params),
                None => (range.trim(), ""),
            };
            let quality = params
                .split(';')
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                // A quality that does not parse is no quality at all: the range is not accepted.
                .map_or(Some(1.0), |(_, v)| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            if media.eq_ignore_ascii_case(openmetrics_media_type) {
                openmetrics = openmetrics.max(quality);
            } else if media.eq_ignore_ascii_case(classic_media_type) {
                classic = classic.max(quality);
            }
        }
        if openmetrics > 0.0 && openmetrics >= classic {
            Format::OpenMetrics
        } else {
            Format::Classic
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Classic => classic_content_type,
            Format::OpenMetrics => openmetrics_content_type,
        }
    }

    /// `registry` written in this format.
    pub fn encode(self, registry: &Registry) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        match self {
            Format::Classic => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?
            }
            Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry)?,
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn classic_text_unless_the_scraper_prefers_openmetrics() {
        // Issue 25 item 6: promtool and curl ask for text (or nothing) and must get the classic
        // format; Prometheus names OpenMetrics first and gets it.
        let prometheus_2_42 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(
            Format::negotiate(Some(prometheus_2_42)),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("Application/OpenMetrics-Text")),
            Format::OpenMetrics
        );
        for classic in [
            None,
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain;version=0.0.4"),
            Some("text/plain;q=1, application/openmetrics-text;q=0.5"),
            Some("application/openmetrics-text;q=0"),
            Some("application/openmetrics-text;q=oops"),
            Some("application/json"),
            Some(""),
        ] {
            assert_eq!(Format::negotiate(classic), Format::Classic, "{classic:?}");
        }
    }

    #[test]
    fn both_formats_say_the_same_counter_and_only_openmetrics_ends_with_eof() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("mesh_things", "Things done", counter.clone());
        counter.inc_by(3);
        let classic = Format::Classic.encode(&registry).expect("classic");
        assert_eq!(
            classic,
            "# HELP mesh_things_total Things done.\n# TYPE mesh_things_total counter\nmesh_things_total 3\n"
        );
        let open = Format::OpenMetrics.encode(&registry).expect("openmetrics");
        assert!(open.contains("\nmesh_things_total 3\n"), "{open}");
        assert!(open.ends_with("# EOF\n"), "{open}");
    }
}
