//! `[telemetry]`: where traces go. Off unless an OTLP endpoint is named,
//! here or by the standard `OTEL_EXPORTER_OTLP_ENDPOINT`; the standard
//! variables fill in what the section leaves out (the file wins where both
//! speak), and `OTEL_SDK_DISABLED=true` turns traces off.

use super::ConfigError;
use crate::domain::LimitsError;
use crate::telemetry::traces::{TraceProtocol, TraceSettings};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[telemetry]` as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// The OTLP collector (`http://collector:4317` for gRPC,
    /// `http://collector:4318` for HTTP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// `grpc` (the default) or `http/protobuf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_protocol: Option<String>,
    /// `service.name` of the spans (default `ctxbudget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Finished spans held for export at most (default 2,048); more are
    /// dropped and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued_spans: Option<usize>,
    /// How long one export may take (ms, default 10,000) before its batch
    /// is dropped and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export_timeout_ms: Option<u64>,
}

/// Spans held for export by default.
const DEFAULT_MAX_QUEUED_SPANS: usize = 2048;
/// One export's deadline by default.
const DEFAULT_EXPORT_TIMEOUT_MS: u64 = 10_000;

impl TelemetrySection {
    /// The trace settings, the variables read through `env` filling what the
    /// section leaves out.
    pub fn traces(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<TraceSettings, ConfigError> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let disabled =
            set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let endpoint = self
            .otlp_endpoint
            .clone()
            .or_else(|| set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
            .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .filter(|_| !disabled);
        let protocol = self.protocol(set)?;
        if let Some(e) = &endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            return Err(invalid(
                "telemetry.otlp_endpoint",
                format!(
                    "is {e:?}; name the collector as a URL, e.g. \"http://otel-collector:4317\""
                ),
            ));
        }
        let max_queued_spans = self.max_queued_spans.unwrap_or(DEFAULT_MAX_QUEUED_SPANS);
        if !(1..=1_000_000).contains(&max_queued_spans) {
            return Err(invalid(
                "telemetry.max_queued_spans",
                format!("is {max_queued_spans}; hold 1 to 1000000 spans"),
            ));
        }
        let export_timeout_ms = self.export_timeout_ms.unwrap_or(DEFAULT_EXPORT_TIMEOUT_MS);
        if !(1..=600_000).contains(&export_timeout_ms) {
            return Err(invalid(
                "telemetry.export_timeout_ms",
                format!("is {export_timeout_ms}; allow 1 to 600000 ms"),
            ));
        }
        Ok(TraceSettings {
            endpoint,
            protocol,
            service_name: self
                .service_name
                .clone()
                .or_else(|| set("OTEL_SERVICE_NAME"))
                .unwrap_or_else(|| "ctxbudget".to_string()),
            max_queued_spans,
            export_timeout: Duration::from_millis(export_timeout_ms),
        })
    }
}

impl TelemetrySection {
    /// The OTLP transport: the section's, else the standard variables', else
    /// gRPC.
    fn protocol(&self, set: impl Fn(&str) -> Option<String>) -> Result<TraceProtocol, ConfigError> {
        let (protocol, field) = match &self.otlp_protocol {
            Some(p) => (Some(p.clone()), "telemetry.otlp_protocol"),
            None => (
                set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL")),
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
        };
        match protocol {
            None => Ok(TraceProtocol::Grpc),
            Some(p) => TraceProtocol::parse(&p).ok_or_else(|| {
                invalid(
                    field,
                    format!("is {p:?}; use \"grpc\" or \"http/protobuf\""),
                )
            }),
        }
    }
}

fn invalid(field: &str, message: String) -> ConfigError {
    ConfigError::Invalid(LimitsError::new(field, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_string())
        }
    }

    #[test]
    fn off_unless_an_endpoint_is_named() {
        let t = TelemetrySection::default().traces(env(&[])).unwrap();
        assert_eq!(t.endpoint, None);
        assert_eq!(t.service_name, "ctxbudget");
    }

    #[test]
    fn the_standard_variables_fill_what_the_file_leaves_out() {
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "budget-eu"),
        ]);
        let t = TelemetrySection::default().traces(vars).unwrap();
        assert_eq!(t.endpoint.as_deref(), Some("http://collector:4318"));
        assert_eq!(t.protocol, TraceProtocol::HttpProtobuf);
        assert_eq!(t.service_name, "budget-eu");
        let file = TelemetrySection {
            otlp_endpoint: Some("http://mine:4317".into()),
            otlp_protocol: Some("grpc".into()),
            ..TelemetrySection::default()
        };
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ]);
        let t = file.traces(vars).unwrap();
        assert_eq!(
            t.endpoint.as_deref(),
            Some("http://mine:4317"),
            "the file wins"
        );
        assert_eq!(t.protocol, TraceProtocol::Grpc);
    }

    #[test]
    fn disabled_by_the_standard_switch() {
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_SDK_DISABLED", "true"),
        ]);
        assert_eq!(
            TelemetrySection::default().traces(vars).unwrap().endpoint,
            None
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        let bad = TelemetrySection {
            otlp_endpoint: Some("collector:4317".into()),
            ..TelemetrySection::default()
        };
        let e = bad.traces(env(&[])).unwrap_err().to_string();
        assert!(e.contains("telemetry.otlp_endpoint"), "{e}");
        let e = TelemetrySection::default()
            .traces(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && e.contains("http/protobuf"),
            "{e}"
        );
    }
}
