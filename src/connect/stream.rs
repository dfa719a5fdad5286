//! Connect server streaming (Watch): the request is one enveloped
//! message; the answer is a 200 with one envelope per gRPC message (JSON
//! or protobuf) and then the end-of-stream envelope (flag 0x02), a JSON
//! object carrying the gRPC status as a Connect error, if any.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderValue, header};
use http_body_util::BodyExt;
use serde::Serialize;

use super::errors::{ConnectError, ErrorJson};
use super::routes::Procedure;
use super::{BoxError, Codec, Response, body_error, grpc_error};

/// Envelope flag of the end-of-stream message.
const END_STREAM: u8 = 0x02;

/// The messages of a run of envelopes (gRPC's frames have the same
/// shape: a flag byte, a big-endian length, the message).
pub(super) fn frames(data: &Bytes) -> impl Iterator<Item = Result<Bytes, ConnectError>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= data.len() {
            return None;
        }
        let Some(header) = data.get(at..at + 5) else {
            at = data.len();
            return Some(Err(ConnectError::invalid_argument(
                "a truncated envelope (fewer than 5 bytes)",
            )));
        };
        let flags = header[0];
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let end = at + 5 + len;
        let message = if flags != 0 {
            Err(ConnectError::invalid_argument(format!(
                "envelope flags {flags:#04x}: compressed or end-of-stream envelopes are not accepted here"
            )))
        } else if end > data.len() {
            Err(ConnectError::invalid_argument(
                "an envelope longer than the body",
            ))
        } else {
            Ok(data.slice(at + 5..end))
        };
        at = if message.is_ok() { end } else { data.len() };
        Some(message)
    })
}

/// A streaming request's one message.
pub(super) fn request_message(body: Bytes) -> Result<Bytes, ConnectError> {
    let mut messages = frames(&body);
    let first = messages
        .next()
        .ok_or_else(|| ConnectError::invalid_argument("no request message (an empty body)"))??;
    if messages.next().is_some() {
        return Err(ConnectError::invalid_argument(
            "more than one request message: Watch takes one",
        ));
    }
    Ok(first)
}

#[derive(Serialize)]
struct EndStream<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorJson<'a>>,
}

fn envelope(flags: u8, message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(flags);
    out.put_u32(message.len() as u32);
    out.put_slice(message);
    out.freeze()
}

fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let end = EndStream {
        error: error.map(ConnectError::json),
    };
    envelope(END_STREAM, &serde_json::to_vec(&end).unwrap_or_default())
}

fn streaming_response(codec: Codec, body: tonic::body::Body) -> Response {
    let mut response = http::Response::new(body);
    let content_type = match codec {
        Codec::Json => "application/connect+json",
        Codec::Proto => "application/connect+proto",
    };
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A stream that failed before its first message: 200 and only the end.
pub(super) fn failed(codec: Codec, err: &ConnectError) -> Response {
    let body = http_body_util::Full::new(end_stream(Some(err)));
    streaming_response(codec, tonic::body::Body::new(body))
}

/// The gRPC answer of a server-streaming RPC as a Connect stream.
pub(super) fn response<R>(
    procedure: &'static Procedure,
    codec: Codec,
    response: http::Response<R>,
) -> Response
where
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    if let Some(err) = grpc_error(&parts.headers) {
        return failed(codec, &err);
    }
    struct State<R> {
        body: std::pin::Pin<Box<R>>,
        buf: BytesMut,
        done: bool,
    }
    let state = State {
        body: Box::pin(body),
        buf: BytesMut::new(),
        done: false,
    };
    let envelopes = futures::stream::unfold(state, move |mut state| async move {
        if state.done {
            return None;
        }
        loop {
            if let Some(message) = take_message(&mut state.buf) {
                let encoded = match (message, codec) {
                    (Ok(message), Codec::Proto) => Ok(envelope(0, &message)),
                    (Ok(message), Codec::Json) => {
                        (procedure.response_to_json)(&message).map(|json| envelope(0, &json))
                    }
                    (Err(err), _) => Err(err),
                };
                let data = encoded.unwrap_or_else(|err| {
                    state.done = true;
                    end_stream(Some(&err))
                });
                return Some((Ok::<_, tonic::Status>(http_body::Frame::data(data)), state));
            }
            let end = match state.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        state.buf.extend_from_slice(&data);
                        continue;
                    }
                    Err(frame) => frame.into_trailers().ok().and_then(|t| grpc_error(&t)),
                },
                Some(Err(err)) => Some(body_error(err.into())),
                None => None,
            };
            state.done = true;
            return Some((Ok(http_body::Frame::data(end_stream(end.as_ref()))), state));
        }
    });
    streaming_response(
        codec,
        tonic::body::Body::new(http_body_util::StreamBody::new(envelopes)),
    )
}

/// The next whole gRPC message in `buf`, if it holds one.
fn take_message(buf: &mut BytesMut) -> Option<Result<Bytes, ConnectError>> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return None;
    }
    let compressed = buf[0] != 0;
    buf.advance(5);
    let message = buf.split_to(len).freeze();
    Some(if compressed {
        Err(ConnectError::internal(
            "a compressed message from the service",
        ))
    } else {
        Ok(message)
    })
}
