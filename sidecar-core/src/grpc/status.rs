//! gRPC statuses without a transport: the codes, the statuses the sidecar
//! answers or ends a stream with (a code and a message; its refusals come
//! from [`crate::policy::Refusal::grpc_status`]) and the canonical code
//! names used as metric labels. The shell turns a [`Status`] into trailers (`tonic`'s encoding).

/// A gRPC status code, with the numbers of `google.rpc.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// The call was cancelled.
    Cancelled = 1,
    /// An unknown error.
    Unknown = 2,
    /// The client named something invalid.
    InvalidArgument = 3,
    /// The deadline passed before the call completed.
    DeadlineExceeded = 4,
    /// A requested entity was not found.
    NotFound = 5,
    /// An entity the client tried to create exists.
    AlreadyExists = 6,
    /// The caller may not do this.
    PermissionDenied = 7,
    /// A resource (a quota, a size limit) is exhausted.
    ResourceExhausted = 8,
    /// The system is not in the state the call needs.
    FailedPrecondition = 9,
    /// The call was aborted (a concurrency conflict).
    Aborted = 10,
    /// Past the valid range.
    OutOfRange = 11,
    /// The method is not implemented or not supported.
    Unimplemented = 12,
    /// An internal error.
    Internal = 13,
    /// The service is unavailable.
    Unavailable = 14,
    /// Unrecoverable data loss.
    DataLoss = 15,
    /// No valid authentication credentials.
    Unauthenticated = 16,
}

impl Code {
    /// The code numbered `value`; an unknown number is `Unknown`.
    pub fn from_i32(value: i32) -> Self {
        use Code::*;
        const ALL: [Code; 17] = [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ];
        usize::try_from(value)
            .ok()
            .and_then(|i| ALL.get(i).copied())
            .unwrap_or(Unknown)
    }

    /// The canonical name (`NOT_FOUND`), as gRPC tools print it.
    pub fn name(self) -> &'static str {
        match self {
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
}

/// A status the sidecar answers or ends a stream with: a code, a message
/// and, for its own refusals, a reason that machines can match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    code: Code,
    message: String,
    reason: Option<&'static str>,
}

/// The `google.rpc.ErrorInfo.domain` of the sidecar's own refusals.
pub const ERROR_DOMAIN: &str = "bucketmap.dev";

/// `google.rpc.ErrorInfo.reason` of a request the sidecar cannot read.
pub const BAD_REQUEST: &str = "BAD_REQUEST";
/// `google.rpc.ErrorInfo.reason` of a message beyond the sidecar's limit.
pub const TOO_LARGE: &str = "TOO_LARGE";
/// `google.rpc.ErrorInfo.reason` of a call whose own deadline passed.
pub const DEADLINE_EXCEEDED: &str = "DEADLINE_EXCEEDED";
/// `google.rpc.ErrorInfo.reason` of a fault of the sidecar itself.
pub const INTERNAL: &str = "INTERNAL";

impl Status {
    /// A status of `code` saying `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            reason: None,
        }
    }

    /// This status with `reason` (UPPER_SNAKE_CASE), carried as a
    /// `google.rpc.ErrorInfo` in its details ([`Status::details`]).
    pub fn with_reason(mut self, reason: &'static str) -> Self {
        self.reason = Some(reason);
        self
    }

    /// The reason, if the status has one.
    pub fn reason(&self) -> Option<&'static str> {
        self.reason
    }

    /// The encoded `google.rpc.Status` of the `grpc-status-details-bin`
    /// trailer: code, message and an `ErrorInfo` with the reason and
    /// [`ERROR_DOMAIN`]. `None` without a reason.
    pub fn details(&self) -> Option<Vec<u8>> {
        use prost::encoding::{WireType, encode_key, encode_varint, int32, string};
        let nested = |tag: u32, bytes: &[u8], out: &mut Vec<u8>| {
            encode_key(tag, WireType::LengthDelimited, out);
            encode_varint(bytes.len() as u64, out);
            out.extend_from_slice(bytes);
        };
        let reason = self.reason?;
        let mut info = Vec::new();
        string::encode(1, &reason.to_owned(), &mut info);
        string::encode(2, &ERROR_DOMAIN.to_owned(), &mut info);
        let mut any = Vec::new();
        string::encode(
            1,
            &"type.googleapis.com/google.rpc.ErrorInfo".to_owned(),
            &mut any,
        );
        nested(2, &info, &mut any);
        let mut status = Vec::new();
        int32::encode(1, &(self.code as i32), &mut status);
        string::encode(2, &self.message, &mut status);
        nested(3, &any, &mut status);
        Some(status)
    }

    /// `INVALID_ARGUMENT`.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message).with_reason(BAD_REQUEST)
    }

    /// `RESOURCE_EXHAUSTED`.
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, message).with_reason(TOO_LARGE)
    }

    /// `INTERNAL`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message).with_reason(INTERNAL)
    }

    /// `DEADLINE_EXCEEDED`.
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(Code::DeadlineExceeded, message).with_reason(DEADLINE_EXCEEDED)
    }

    /// The code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

impl std::error::Error for Status {}

/// The canonical name of `code` (`NOT_FOUND`), as gRPC tools print it.
pub fn code_name(code: Code) -> &'static str {
    code.name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_keep_their_numbers_and_names() {
        let mut seen = 0;
        for n in 0..17 {
            let code = Code::from_i32(n);
            assert_eq!(code as i32, n);
            assert!(
                code_name(code)
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_')
            );
            seen += 1;
        }
        assert_eq!(seen, 17);
        assert_eq!(Code::from_i32(17), Code::Unknown);
        assert_eq!(Code::from_i32(-1), Code::Unknown);
        assert_eq!(code_name(Code::NotFound), "NOT_FOUND");
    }

    #[test]
    fn a_reason_travels_as_error_info_in_the_details() {
        use googleapis_tonic_google_storage_v2::google::rpc;
        use prost::Message as _;
        assert_eq!(Status::new(Code::NotFound, "gone").details(), None);
        let status = Status::new(Code::NotFound, "no such bucket").with_reason("UNKNOWN_BUCKET");
        let bytes = status.details().expect("details");
        let decoded = rpc::Status::decode(bytes.as_slice()).expect("a google.rpc.Status");
        assert_eq!(decoded.code, Code::NotFound as i32);
        assert_eq!(decoded.message, "no such bucket");
        assert_eq!(decoded.details.len(), 1);
        let any = &decoded.details[0];
        assert_eq!(any.type_url, "type.googleapis.com/google.rpc.ErrorInfo");
        let info = rpc::ErrorInfo::decode(any.value.as_slice()).expect("an ErrorInfo");
        assert_eq!(info.reason, "UNKNOWN_BUCKET");
        assert_eq!(info.domain, ERROR_DOMAIN);
    }
}
