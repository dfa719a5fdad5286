//! What travels beside the messages: the gRPC metadata keys tumbler sets
//! where the proto has no field (a health answer's reason, an interrupted
//! Clear's counts), and the canonical names of gRPC status codes. The
//! server sets them and clients read them from here, so the two sides
//! cannot spell one differently.

/// Response header of a grpc.health.v1 answer NOT_SERVING that says why
/// (the health protocol's reply has no field for it): the same reason the
/// server's log and its RPCs' UNAVAILABLE give. `tumbler health` prints it.
pub const HEALTH_REASON: &str = "tumbler-reason";

/// Trailer of a Clear that stopped partway: locks cleared before it stopped.
pub const CLEARED_LOCKS: &str = "tumbler-locks-cleared";
/// Trailer of a Clear that stopped partway: grants released before it stopped.
pub const CLEARED_GRANTS: &str = "tumbler-grants-released";
/// Trailer of a Clear that stopped partway: waiting requests dropped before
/// it stopped.
pub const CLEARED_REQUESTS: &str = "tumbler-requests-dropped";

/// The canonical name of a gRPC status code (`UNAVAILABLE`, as in
/// `google.rpc.Code`): what Prometheus labels, OpenTelemetry spans and the
/// command-line client's error lines show.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
