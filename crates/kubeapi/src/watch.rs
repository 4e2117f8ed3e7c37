//! Watch streams: newline-delimited JSON events (`{"type": "...", "object": {...}}`) read from
//! a chunked response body, one bounded line at a time.

use std::time::Duration;

use futures_util::Stream;
use http_body_util::BodyExt;
use kube::client::Body;
use serde::Deserialize;
use serde_json::Value;

use crate::client::{Error, StatusObject};

/// `type` of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    /// Only `metadata.resourceVersion` of the object is meaningful.
    Bookmark,
    /// The object is a `Status`; see [`WatchEvent::error_status`].
    Error,
}

impl EventType {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ADDED" => Self::Added,
            "MODIFIED" => Self::Modified,
            "DELETED" => Self::Deleted,
            "BOOKMARK" => Self::Bookmark,
            "ERROR" => Self::Error,
            _ => return None,
        })
    }
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchEvent {
    pub kind: EventType,
    pub object: Value,
}

impl WatchEvent {
    /// Parses one line of a watch stream.
    pub fn parse(line: &[u8]) -> Result<Self, Error> {
        #[derive(Deserialize)]
        struct Raw {
            #[serde(rename = "type")]
            kind: String,
            #[serde(default)]
            object: Value,
        }
        let raw: Raw = serde_json::from_slice(line).map_err(|source| Error::Json {
            what: "a watch event",
            source,
        })?;
        let kind = EventType::parse(&raw.kind).ok_or_else(|| Error::Shape {
            what: "watch event type",
            reason: format!("{:?}", raw.kind),
        })?;
        if !raw.object.is_object() {
            return Err(Error::Shape {
                what: "watch event object",
                reason: format!("expected an object, found {}", raw.object),
            });
        }
        Ok(Self {
            kind,
            object: raw.object,
        })
    }

    /// For an `ERROR` event, its status as an error ([`Error::Gone`] for 410).
    pub fn error_status(&self) -> Option<Error> {
        if self.kind != EventType::Error {
            return None;
        }
        let status: StatusObject = serde_json::from_value(self.object.clone()).unwrap_or_default();
        Some(
            if status.code == 410 || status.reason == "Expired" || status.reason == "Gone" {
                Error::Gone {
                    message: status.message,
                }
            } else {
                Error::Status {
                    method: hyper::Method::GET,
                    path: "(watch)".into(),
                    status: status.code,
                    reason: status.reason,
                    message: status.message,
                }
            },
        )
    }
}

/// An open watch. [`WatchStream::next`] yields events until the server ends the stream
/// (`None`) or something fails (one `Err`, then `None`).
#[derive(Debug)]
pub struct WatchStream {
    body: Body,
    server: String,
    buf: Vec<u8>,
    /// Bytes of `buf` already searched for a newline.
    scanned: usize,
    max_line: usize,
    idle: Duration,
    eof: bool,
    failed: bool,
}

impl WatchStream {
    pub(crate) fn new(body: Body, server: String, max_line: usize, idle: Duration) -> Self {
        Self {
            body,
            server,
            buf: Vec::new(),
            scanned: 0,
            max_line,
            idle,
            eof: false,
            failed: false,
        }
    }

    /// The next event.
    pub async fn next(&mut self) -> Option<Result<WatchEvent, Error>> {
        if self.failed {
            return None;
        }
        let result = self.next_inner().await;
        if let Some(Err(_)) = result {
            self.failed = true;
        }
        result
    }

    async fn next_inner(&mut self) -> Option<Result<WatchEvent, Error>> {
        loop {
            if let Some(pos) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
                let end = self.scanned + pos;
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                self.scanned = 0;
                if line.trim_ascii().is_empty() {
                    continue;
                }
                return Some(WatchEvent::parse(&line));
            }
            self.scanned = self.buf.len();
            if self.buf.len() > self.max_line {
                return Some(Err(Error::TooLarge {
                    what: "watch event",
                    limit: self.max_line,
                }));
            }
            if self.eof {
                // A last event without its newline still counts.
                let rest = std::mem::take(&mut self.buf);
                self.scanned = 0;
                if rest.trim_ascii().is_empty() {
                    return None;
                }
                return Some(WatchEvent::parse(&rest));
            }
            match tokio::time::timeout(self.idle, self.body.frame()).await {
                Err(_) => return Some(Err(Error::Idle(self.idle))),
                Ok(None) => self.eof = true,
                Ok(Some(Err(source))) => {
                    return Some(Err(Error::Transport {
                        server: self.server.clone(),
                        source,
                    }));
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The events as a [`Stream`].
    pub fn into_stream(self) -> impl Stream<Item = Result<WatchEvent, Error>> + Send {
        futures_util::stream::unfold(self, |mut stream| async move {
            stream.next().await.map(|item| (item, stream))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_lines() {
        let ok =
            WatchEvent::parse(br#"{"type":"ADDED","object":{"metadata":{"name":"a"}}}"#).unwrap();
        assert_eq!(ok.kind, EventType::Added);
        let gone = WatchEvent::parse(
            br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old"}}"#,
        )
        .unwrap();
        assert!(matches!(gone.error_status(), Some(Error::Gone { .. })));
        assert!(ok.error_status().is_none());
        let bad: [&[u8]; 5] = [
            b"not json",
            br#"{"type":"ADDED"}"#,
            br#"{"type":"SOMETHING","object":{}}"#,
            br#"{"type":"ADDED","object":[1]}"#,
            br#"{"object":{}}"#,
        ];
        for line in bad {
            assert!(
                WatchEvent::parse(line).is_err(),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }
}
