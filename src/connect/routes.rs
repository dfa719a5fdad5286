//! The Connect route table: every unary and server-streaming RPC of
//! `tumbler.v1.LockService` with its messages' proto3 JSON codec. The list
//! is one macro invocation; a unit test compares it with the service in
//! the descriptor set, so an RPC added to `lock.proto` fails the build's
//! tests until it is here (Session, bidirectional, stays gRPC-only).

use prost::Message;

use super::errors::ConnectError;
use super::json;
use crate::proto;

/// How a procedure's messages travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One request, one response (`application/json`, `application/proto`).
    Unary,
    /// One request, a stream of responses (`application/connect+json`,
    /// `application/connect+proto`, enveloped).
    ServerStreaming,
}

/// One Connect procedure: `/tumbler.v1.LockService/<name>`.
pub struct Procedure {
    pub name: &'static str,
    pub kind: Kind,
    /// A JSON request body into the protobuf bytes tonic decodes.
    pub request_from_json: fn(&[u8]) -> Result<Vec<u8>, ConnectError>,
    /// A protobuf response message from tonic into JSON.
    pub response_to_json: fn(&[u8]) -> Result<Vec<u8>, ConnectError>,
}

/// The path prefix of every procedure.
pub const SERVICE_PREFIX: &str = "/tumbler.v1.LockService/";

macro_rules! procedures {
    ($($name:literal => $kind:ident($request:ident, $response:ident),)*) => {
        /// Every procedure served over Connect.
        pub static PROCEDURES: &[Procedure] = &[$(
            Procedure {
                name: $name,
                kind: Kind::$kind,
                request_from_json: |body| {
                    let message: proto::$request = json::decode(body)?;
                    Ok(message.encode_to_vec())
                },
                response_to_json: |bytes| {
                    let message = proto::$response::decode(bytes)
                        .map_err(|e| ConnectError::internal(format!("tumbler's reply does not decode: {e}")))?;
                    json::encode(&message)
                },
            },
        )*];

        #[cfg(test)]
        const MESSAGES: &[(&str, &str, &str)] = &[$(($name, stringify!($request), stringify!($response)),)*];
    };
}

procedures! {
    "Acquire" => Unary(AcquireRequest, AcquireResponse),
    "Release" => Unary(ReleaseRequest, ReleaseResponse),
    "Extend" => Unary(ExtendRequest, ExtendResponse),
    "Batch" => Unary(BatchRequest, BatchResponse),
    "Inspect" => Unary(InspectRequest, InspectResponse),
    "Queue" => Unary(QueueRequest, QueueResponse),
    "List" => Unary(ListRequest, ListResponse),
    "ListNamespaces" => Unary(ListNamespacesRequest, ListNamespacesResponse),
    "Reap" => Unary(ReapRequest, ReapResponse),
    "Clear" => Unary(ClearRequest, ClearResponse),
    "Metrics" => Unary(MetricsRequest, MetricsResponse),
    "Watch" => ServerStreaming(WatchRequest, LockEvent),
    "Campaign" => Unary(CampaignRequest, CampaignResponse),
    "Proclaim" => Unary(ProclaimRequest, ProclaimResponse),
    "Leader" => Unary(LeaderRequest, LeaderResponse),
    "Observe" => ServerStreaming(LeaderRequest, LeaderChange),
    "Resign" => Unary(ResignRequest, ResignResponse),
}

/// The procedure a request path names, if Connect serves it.
pub fn find(path: &str) -> Option<&'static Procedure> {
    let name = path.strip_prefix(SERVICE_PREFIX)?;
    PROCEDURES.iter().find(|procedure| procedure.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is the service: every RPC of `LockService` in the
    /// descriptor set but the bidirectional ones, with its messages.
    #[test]
    fn the_table_is_the_service_in_the_descriptor_set() {
        let set = prost_types::FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET).unwrap();
        let service = set
            .file
            .iter()
            .filter(|file| file.package() == "tumbler.v1")
            .flat_map(|file| &file.service)
            .find(|service| service.name() == "LockService")
            .unwrap();
        let mut expected = Vec::new();
        for method in &service.method {
            if method.client_streaming() {
                assert_eq!(
                    method.name(),
                    "Session",
                    "a new client-streaming RPC: decide its Connect form"
                );
                continue;
            }
            let kind = if method.server_streaming() {
                Kind::ServerStreaming
            } else {
                Kind::Unary
            };
            let short = |ty: &str| ty.trim_start_matches(".tumbler.v1.").to_owned();
            expected.push((
                method.name().to_owned(),
                kind,
                short(method.input_type()),
                short(method.output_type()),
            ));
        }
        let table: Vec<_> = MESSAGES
            .iter()
            .map(|(name, request, response)| {
                (
                    name.to_string(),
                    find(&format!("{SERVICE_PREFIX}{name}")).unwrap().kind,
                    request.to_string(),
                    response.to_string(),
                )
            })
            .collect();
        assert_eq!(table, expected);
    }
}
