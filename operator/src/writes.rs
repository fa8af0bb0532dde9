//! The operator's writes to the API server, one object each. A write that fails fails for its
//! object alone: every other write of the pass still runs, and the failure comes back typed,
//! naming its object, with a label for the metric.

use std::future::Future;
use std::pin::Pin;

use futures::StreamExt;

#[derive(Debug, thiserror::Error)]
#[error("{object}: {source}")]
pub struct WriteError {
    /// `Kind namespace/name` (or `Kind name` for a cluster-scoped object).
    pub object: String,
    #[source]
    pub source: kube::Error,
}

impl WriteError {
    pub fn new(object: impl Into<String>, source: kube::Error) -> Self {
        WriteError {
            object: object.into(),
            source,
        }
    }

    /// The reason, for `aether_operator_write_errors_total{reason}`.
    pub fn metric_label(&self) -> &'static str {
        match &self.source {
            kube::Error::Api(e) => match e.code {
                404 => "not_found",
                403 => "forbidden",
                409 => "conflict",
                422 => "invalid",
                code if code >= 500 => "server_error",
                _ => "refused",
            },
            kube::Error::SerdeError(_) => "unreadable",
            _ => "unreachable",
        }
    }

    /// Whether the object's namespace is being deleted: the write cannot succeed until it is
    /// gone, and no retry will change that.
    pub fn namespace_terminating(&self) -> bool {
        matches!(&self.source, kube::Error::Api(e) if e.code == 403 && e.message.contains("is being terminated"))
    }
}

/// One object's write.
pub type Write<'a> = Pin<Box<dyn Future<Output = Result<(), WriteError>> + Send + 'a>>;

/// Runs every write, `in_flight` at a time, each to its end; returns the failures.
pub async fn all(writes: Vec<Write<'_>>, in_flight: usize) -> Vec<WriteError> {
    futures::stream::iter(writes)
        .buffer_unordered(in_flight)
        .filter_map(|result| async move { result.err() })
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[tokio::test]
    async fn one_failing_write_leaves_the_others_to_run() {
        let ran = std::sync::atomic::AtomicUsize::new(0);
        let mut writes: Vec<Write<'_>> = Vec::new();
        for i in 0..5 {
            let ran = &ran;
            writes.push(Box::pin(async move {
                ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i == 1 {
                    return Err(WriteError::new(
                        "RouteTarget ghost/web",
                        api_error(404, "namespaces \"ghost\" not found"),
                    ));
                }
                Ok(())
            }));
        }
        let failed = all(writes, 2).await;
        assert_eq!(ran.load(std::sync::atomic::Ordering::Relaxed), 5);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].metric_label(), "not_found");
        assert!(failed[0].to_string().starts_with("RouteTarget ghost/web: "));
    }

    #[test]
    fn a_terminating_namespace_is_told_apart() {
        let terminating = WriteError::new(
            "RouteTarget gone/web",
            api_error(
                403,
                "unable to create new content in namespace gone because it is being terminated",
            ),
        );
        assert!(terminating.namespace_terminating());
        assert_eq!(terminating.metric_label(), "forbidden");
        let forbidden = WriteError::new("RouteTarget x/web", api_error(403, "forbidden"));
        assert!(!forbidden.namespace_terminating());
    }
}
