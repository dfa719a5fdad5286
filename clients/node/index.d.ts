// Types of tumbler-client. Message types are generated from
// proto/tumbler/v1/lock.proto when the package is packed (types/).
import * as grpc from '@grpc/grpc-js';
import type { Grant__Output as Grant } from './types/tumbler/v1/Grant';
import type { AcquireResponse__Output as AcquireResponse } from './types/tumbler/v1/AcquireResponse';
import type { InspectResponse__Output as InspectResponse } from './types/tumbler/v1/InspectResponse';
import type { QueueResponse__Output as QueueResponse } from './types/tumbler/v1/QueueResponse';
import type { LockServiceClient } from './types/tumbler/v1/LockService';
import type { Leadership__Output as LeadershipMessage } from './types/tumbler/v1/Leadership';
import type { LeaderChange__Output as LeaderChange } from './types/tumbler/v1/LeaderChange';

export type {
  Grant, AcquireResponse, InspectResponse, QueueResponse, LockServiceClient, LeadershipMessage, LeaderChange,
};
export { grpc };
export declare const DEFAULT_HELPER_TTL_MS: number;

export interface RetryOptions { initialMs?: number; maxMs?: number; multiplier?: number }

export interface ClientOptions {
  namespace?: string;
  /** TLS: grpc.credentials.createSsl(...); default plaintext. */
  credentials?: grpc.ChannelCredentials;
  /** Sent as `authorization: Bearer <token>`. */
  token?: string;
  /** Deadline of the calls that do not wait, retries included (default 10 000). */
  timeoutMs?: number;
  retry?: RetryOptions;
  protoDir?: string;
  /** Options of the gRPC channel (streams, and unary calls under `transport: 'grpc'`). */
  channelOptions?: grpc.ChannelOptions;
  /**
   * How unary calls travel: 'auto' (default) sends them over Connect (binary protobuf on kept-alive
   * HTTP/1.1 to the same port) for a plaintext `host:port` target, else over gRPC; 'connect' insists
   * on Connect; 'grpc' keeps every call on @grpc/grpc-js. Streams (observe) are always gRPC.
   */
  transport?: 'auto' | 'connect' | 'grpc';
}

export interface AcquireOptions {
  /** Default: an id made by the client, so retries are the same request. */
  holder?: string;
  /** Wait this long in the server; 0 tries once. */
  waitMs?: number;
  /** Bounds the whole call, retries included (default waitMs + 5 000). */
  timeoutMs?: number;
  /** Cancels a waiting acquire: the server drops the request at once. */
  signal?: AbortSignal;
  limit?: number;
  ttlMs?: number;
  kind?: string;
  metadata?: Record<string, string>;
  priority?: number;
  queueTtlMs?: number;
  fair?: boolean;
  /** A read/write lock: 'read' shares with other readers (up to `limit`), 'write' is alone. */
  mode?: 'read' | 'write';
  /** With mode 'read': take a free read permit even when writers wait. */
  preferReaders?: boolean;
  /** Take this many of `limit`'s permits at once (default 1); more than `limit` is an InvalidArgumentError. */
  permits?: number;
}

export interface WithLockOptions extends AcquireOptions {
  /** Called at once when the grant is lost. */
  onLost?: (err: LockLostError) => void;
}

export declare class Lock {
  readonly name: string;
  grant: Grant;
  readonly holder: string;
  /** A decimal string (uint64). */
  readonly fencingToken: string;
  readonly slot: number;
  readonly ttlMs: number;
  /** 'read' or 'write' for a grant of a read/write lock, null for a plain lock's. */
  readonly mode: 'read' | 'write' | null;
  /** The permits the grant holds (1 unless acquired with `permits`). */
  readonly permits: number;
  /** The grant's slots, one per permit, ascending; the first is `slot`. */
  readonly slots: number[];
  lost: boolean;
  lostReason: string | null;
  /** Aborted, with a LockLostError as reason, the moment the grant is known lost. */
  readonly signal: AbortSignal;
  extend(ttlMs?: number): Promise<Lock>;
  /** A write grant becomes a read grant: same fencing token, slot and lease. */
  downgrade(): Promise<Lock>;
  release(): Promise<boolean>;
  keepAlive(options?: { onLost?: (err: LockLostError) => void }): Lock;
  stopKeepAlive(): void;
  check(): void;
}

/** A multi-lock's options: one holder, wait and lease for the set; `limit`: permits of each lock (default 1). */
export type AcquireAllOptions = Pick<AcquireOptions,
  'holder' | 'waitMs' | 'timeoutMs' | 'signal' | 'limit' | 'ttlMs' | 'kind' | 'metadata' | 'queueTtlMs'>;

export interface WithLockAllOptions extends AcquireAllOptions {
  /** Called at once when any lock of the set is lost. */
  onLost?: (err: LockLostError) => void;
}

/** A multi-lock's grants, held, renewed and released as one. */
export declare class LockSet {
  /** The names joined by commas. */
  readonly name: string;
  /** The names, in the order asked. */
  readonly names: string[];
  readonly holder: string;
  /** One grant per name, in the order asked, each with its `name` and own fencing token. */
  readonly grants: Grant[];
  /** The grant whose lease ends first. */
  grant: Grant;
  readonly ttlMs: number;
  lost: boolean;
  lostReason: string | null;
  /** Aborted, with a LockLostError as reason, the moment any lock of the set is known lost. */
  readonly signal: AbortSignal;
  /** The fencing token (a decimal string) of the lock `name` of the set; null when not in the set. */
  fencingToken(name: string): string | null;
  /** Each lock's fencing token (decimal strings) in the order of `names`: the set's extend and release are pinned to them. */
  readonly fencingTokens: (string | null)[];
  /** Every lease of the set to ttlMs from now; rejects with LockLostError when any lock was not held. */
  extend(ttlMs?: number): Promise<LockSet>;
  /** True when every lock was still held (the others are released all the same). */
  release(): Promise<boolean>;
  keepAlive(options?: { onLost?: (err: LockLostError) => void }): LockSet;
  stopKeepAlive(): void;
  check(): void;
}

export interface CampaignOptions {
  /** What others see (leader(), observe()) while this candidate leads. */
  value?: string;
  /** Default: an id made by the client, so retries are the same candidacy. */
  candidate?: string;
  /** Wait this long in the election's queue; 0 tries once. */
  waitMs?: number;
  /** Bounds the whole call, retries included (default waitMs + 5 000). */
  timeoutMs?: number;
  /** Cancels a waiting campaign. */
  signal?: AbortSignal;
  /** The leadership's lease, extended every third by the watchdog (default 15 000). */
  ttlMs?: number;
  queueTtlMs?: number;
  kind?: string;
  /** Called at once when the term ends under the leader. */
  onLost?: (err: NotLeaderError) => void;
}

/** One term of this process as the leader; `lost`, `signal` and `check()` as for a Lock. */
export declare class Leadership extends Lock {
  leader: LeadershipMessage;
  readonly candidate: string;
  /** The term: the leader's fencing token, a decimal string (uint64). */
  readonly term: string;
  readonly value: string;
  /** The secret only the winning Campaign was told: Proclaim and Resign send it. */
  readonly secret: string;
  resigned: boolean;
  /** Rejects with NotLeaderError (and the leadership is lost) when the term is over. */
  proclaim(value: string): Promise<Leadership>;
  /** True when this call ended the term; false when it was over already. */
  resign(): Promise<boolean>;
}

/** The leader changes of one election; the first is the current leader (event "current"). */
export declare class Observer implements AsyncIterable<LeaderChange> {
  cancelled: boolean;
  cancel(): void;
  [Symbol.asyncIterator](): AsyncIterator<LeaderChange>;
}

export declare class Client {
  constructor(target?: string, options?: ClientOptions);
  readonly stub: LockServiceClient;
  namespace: string;
  acquire(name: string, options?: AcquireOptions): Promise<Lock>;
  withLock<T>(name: string, options: WithLockOptions, fn: (lock: Lock, signal: AbortSignal) => Promise<T> | T): Promise<T>;
  withLock<T>(name: string, fn: (lock: Lock, signal: AbortSignal) => Promise<T> | T): Promise<T>;
  /** Every lock of `names` (2 to 16 distinct names) or none. */
  acquireAll(names: string[], options?: AcquireAllOptions): Promise<LockSet>;
  withLockAll<T>(names: string[], options: WithLockAllOptions, fn: (set: LockSet, signal: AbortSignal) => Promise<T> | T): Promise<T>;
  withLockAll<T>(names: string[], fn: (set: LockSet, signal: AbortSignal) => Promise<T> | T): Promise<T>;
  campaign(name: string, options?: CampaignOptions): Promise<Leadership | null>;
  leader(name: string): Promise<LeadershipMessage | null>;
  observe(name: string, options?: { signal?: AbortSignal }): Observer;
  inspect(name: string): Promise<InspectResponse>;
  queue(name: string, maxEntries?: number): Promise<QueueResponse>;
  /** 'connect' or 'grpc': how this client's unary calls travel. */
  readonly transport: 'connect' | 'grpc';
  close(): void;
}

export declare class TumblerError extends Error {
  /** The gRPC status code, when the error came from one. */
  code?: grpc.status;
  details: string;
}
export declare class NotAcquiredError extends TumblerError {
  lockName: string;
  response: AcquireResponse | null;
  busy: boolean;
  timeout: boolean;
}
export declare class LockBusyError extends NotAcquiredError {}
export declare class LockTimeoutError extends NotAcquiredError {}
export declare class LockLostError extends TumblerError {
  lockName: string;
  holder: string;
  fencingToken: string;
  reason: string;
}
export declare class NotLeaderError extends LockLostError {
  candidate: string;
  term: string;
}
/** A wait that would close a cycle of waiters (ABORTED); `details` starts with `deadlock: ` and names the cycle. */
export declare class DeadlockError extends TumblerError {}
export declare class InvalidArgumentError extends TumblerError {}
export declare class PermissionDeniedError extends TumblerError {}
export declare class UnavailableError extends TumblerError {}
export declare function loadProto(protoDir?: string): any;
