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

/// A status the sidecar answers or ends a stream with: a code and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    code: Code,
    message: String,
}

impl Status {
    /// A status of `code` saying `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `INVALID_ARGUMENT`.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// `RESOURCE_EXHAUSTED`.
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, message)
    }

    /// `INTERNAL`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// `DEADLINE_EXCEEDED`.
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(Code::DeadlineExceeded, message)
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
}
