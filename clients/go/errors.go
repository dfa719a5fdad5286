package tumbler

// Typed errors: match them with errors.Is (ErrBusy, ErrTimeout, ErrLockLost,
// ErrDeadlock, ErrInvalidArgument, ErrPermissionDenied, ErrUnavailable) or errors.As
// (*NotAcquiredError, *LockLostError, *Error for any gRPC status).

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "tumbler/client/tumblerv1"
)

var (
	// ErrBusy: a try-once request found every permit taken (or fair waiters ahead).
	ErrBusy = errors.New("tumbler: lock busy")
	// ErrTimeout: the wait (WaitMs or the context's deadline) ended without a grant.
	ErrTimeout = errors.New("tumbler: timed out waiting for the lock")
	// ErrLockLost: the grant is gone (Extend answered NOT_HELD, or renewals failed past the lease).
	ErrLockLost = errors.New("tumbler: lock lost")
	// ErrDeadlock: the wait was refused because it would close a wait-for
	// cycle (an *Error with code ABORTED whose message, starting
	// "deadlock: ", names the cycle). Waiting longer cannot help: give back
	// what the holder holds, then try again.
	ErrDeadlock = errors.New("tumbler: deadlock")
	// ErrInvalidArgument: the server refused the request; the message starts with the field.
	ErrInvalidArgument = errors.New("tumbler: invalid argument")
	// ErrPermissionDenied: missing, unknown or expired token, or one that may not do this.
	ErrPermissionDenied = errors.New("tumbler: permission denied")
	// ErrUnavailable: the server or its Redis stayed unreachable until the deadline (retries included).
	ErrUnavailable = errors.New("tumbler: unavailable")
)

// NotAcquiredError: the lock was not granted. errors.Is(err, ErrBusy) or ErrTimeout tells why.
type NotAcquiredError struct {
	Name     string
	Response *pb.AcquireResponse // nil when the deadline cut the call
}

func (e *NotAcquiredError) Error() string {
	if e.Response == nil {
		return fmt.Sprintf("%s: not acquired before the deadline", e.Name)
	}
	return fmt.Sprintf("%s: not acquired (%s, %d holder(s))", e.Name, e.Response.Reason, e.Response.Holders)
}

// Busy tells a try-once refusal; Timeout a wait that ended without a grant.
func (e *NotAcquiredError) Busy() bool {
	return e.Response != nil && e.Response.Reason == pb.NotAcquiredReason_NOT_ACQUIRED_REASON_BUSY
}
func (e *NotAcquiredError) Timeout() bool { return !e.Busy() }

// Is makes errors.Is(err, ErrBusy) and errors.Is(err, ErrTimeout) work.
func (e *NotAcquiredError) Is(target error) bool {
	return (target == ErrBusy && e.Busy()) || (target == ErrTimeout && e.Timeout())
}

// LockLostError: the grant of Name held by Holder with FencingToken is gone.
type LockLostError struct {
	Name, Holder, Reason string
	FencingToken         uint64
}

func (e *LockLostError) Error() string {
	return fmt.Sprintf("%s: lock lost by %s (token %d): %s", e.Name, e.Holder, e.FencingToken, e.Reason)
}
func (e *LockLostError) Is(target error) bool { return target == ErrLockLost }

// Error is a gRPC failure; errors.Is matches the sentinel of its code.
type Error struct {
	Code    codes.Code
	Message string
	err     error
}

func (e *Error) Error() string { return fmt.Sprintf("tumbler: %s: %s", e.Code, e.Message) }
func (e *Error) Unwrap() error { return e.err }
func (e *Error) Is(target error) bool {
	switch e.Code {
	case codes.InvalidArgument:
		return target == ErrInvalidArgument
	case codes.PermissionDenied, codes.Unauthenticated:
		return target == ErrPermissionDenied
	case codes.Unavailable:
		return target == ErrUnavailable
	case codes.Aborted: // other ABORTED answers (a session resume race) say something else
		return target == ErrDeadlock && strings.HasPrefix(e.Message, "deadlock: ")
	}
	return false
}

// IsDeadlock tells a wait refused as a deadlock: errors.Is(err, ErrDeadlock).
func IsDeadlock(err error) bool { return errors.Is(err, ErrDeadlock) }

// fromRPC types a gRPC error; context errors pass through unchanged.
func fromRPC(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &Error{Code: st.Code(), Message: st.Message(), err: err}
}

// retryable: UNAVAILABLE means the server was not reached or its Redis was down; nothing was applied.
func retryable(err error) bool { return status.Code(err) == codes.Unavailable }
