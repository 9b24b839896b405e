from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Pool(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOL_UNSPECIFIED: _ClassVar[Pool]
    POOL_HEAP: _ClassVar[Pool]
    POOL_SOLVED: _ClassVar[Pool]
    POOL_UNSOLVED: _ClassVar[Pool]
    POOL_LEASED: _ClassVar[Pool]
    POOL_QUARANTINED: _ClassVar[Pool]

class ClientSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLIENT_SOURCE_UNSPECIFIED: _ClassVar[ClientSource]
    CLIENT_SOURCE_WORKER: _ClassVar[ClientSource]
    CLIENT_SOURCE_TRL: _ClassVar[ClientSource]
    CLIENT_SOURCE_VERL: _ClassVar[ClientSource]
    CLIENT_SOURCE_TORCH: _ClassVar[ClientSource]
POOL_UNSPECIFIED: Pool
POOL_HEAP: Pool
POOL_SOLVED: Pool
POOL_UNSOLVED: Pool
POOL_LEASED: Pool
POOL_QUARANTINED: Pool
CLIENT_SOURCE_UNSPECIFIED: ClientSource
CLIENT_SOURCE_WORKER: ClientSource
CLIENT_SOURCE_TRL: ClientSource
CLIENT_SOURCE_VERL: ClientSource
CLIENT_SOURCE_TORCH: ClientSource

class Problem(_message.Message):
    __slots__ = ("id", "prompt", "answer", "verifier", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    prompt: str
    answer: str
    verifier: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., prompt: _Optional[str] = ..., answer: _Optional[str] = ..., verifier: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterProblemsRequest(_message.Message):
    __slots__ = ("problems", "replace")
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    problems: _containers.RepeatedCompositeFieldContainer[Problem]
    replace: bool
    def __init__(self, problems: _Optional[_Iterable[_Union[Problem, _Mapping]]] = ..., replace: _Optional[bool] = ...) -> None: ...

class RegisterProblemsResponse(_message.Message):
    __slots__ = ("created", "updated", "total")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    created: int
    updated: int
    total: int
    def __init__(self, created: _Optional[int] = ..., updated: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class SampleProblemsRequest(_message.Message):
    __slots__ = ("batch_size", "worker_id", "lease_timeout_s", "client_source", "request_id", "accepts_group_size")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    worker_id: str
    lease_timeout_s: float
    client_source: ClientSource
    request_id: str
    accepts_group_size: bool
    def __init__(self, batch_size: _Optional[int] = ..., worker_id: _Optional[str] = ..., lease_timeout_s: _Optional[float] = ..., client_source: _Optional[_Union[ClientSource, str]] = ..., request_id: _Optional[str] = ..., accepts_group_size: _Optional[bool] = ...) -> None: ...

class LeasedProblem(_message.Message):
    __slots__ = ("problem", "priority", "source", "group_size")
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    problem: Problem
    priority: float
    source: Pool
    group_size: int
    def __init__(self, problem: _Optional[_Union[Problem, _Mapping]] = ..., priority: _Optional[float] = ..., source: _Optional[_Union[Pool, str]] = ..., group_size: _Optional[int] = ...) -> None: ...

class SampleProblemsResponse(_message.Message):
    __slots__ = ("lease_id", "lease_deadline_unix_s", "problems", "policy_version", "weights_uri", "retry_after_s", "step", "backpressure", "paced", "pace_wait_s")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_URI_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BACKPRESSURE_FIELD_NUMBER: _ClassVar[int]
    PACED_FIELD_NUMBER: _ClassVar[int]
    PACE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    lease_deadline_unix_s: float
    problems: _containers.RepeatedCompositeFieldContainer[LeasedProblem]
    policy_version: int
    weights_uri: str
    retry_after_s: float
    step: int
    backpressure: bool
    paced: bool
    pace_wait_s: float
    def __init__(self, lease_id: _Optional[str] = ..., lease_deadline_unix_s: _Optional[float] = ..., problems: _Optional[_Iterable[_Union[LeasedProblem, _Mapping]]] = ..., policy_version: _Optional[int] = ..., weights_uri: _Optional[str] = ..., retry_after_s: _Optional[float] = ..., step: _Optional[int] = ..., backpressure: _Optional[bool] = ..., paced: _Optional[bool] = ..., pace_wait_s: _Optional[float] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("reward", "token_ids", "logprobs", "text", "truncated", "passed")
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    reward: float
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    text: str
    truncated: bool
    passed: bool
    def __init__(self, reward: _Optional[float] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., text: _Optional[str] = ..., truncated: _Optional[bool] = ..., passed: _Optional[bool] = ...) -> None: ...

class ProblemOutcome(_message.Message):
    __slots__ = ("problem_id", "policy_version", "prompt_token_ids", "completions", "sampling_temperature", "sampling_top_p")
    PROBLEM_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_TOP_P_FIELD_NUMBER: _ClassVar[int]
    problem_id: str
    policy_version: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    sampling_temperature: float
    sampling_top_p: float
    def __init__(self, problem_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., sampling_temperature: _Optional[float] = ..., sampling_top_p: _Optional[float] = ...) -> None: ...

class ReportOutcomesRequest(_message.Message):
    __slots__ = ("lease_id", "outcomes", "worker_id", "client_source", "rewards_only", "more_parts", "unservable_problem_ids")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    REWARDS_ONLY_FIELD_NUMBER: _ClassVar[int]
    MORE_PARTS_FIELD_NUMBER: _ClassVar[int]
    UNSERVABLE_PROBLEM_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    outcomes: _containers.RepeatedCompositeFieldContainer[ProblemOutcome]
    worker_id: str
    client_source: ClientSource
    rewards_only: bool
    more_parts: bool
    unservable_problem_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_id: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[ProblemOutcome, _Mapping]]] = ..., worker_id: _Optional[str] = ..., client_source: _Optional[_Union[ClientSource, str]] = ..., rewards_only: _Optional[bool] = ..., more_parts: _Optional[bool] = ..., unservable_problem_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportOutcomesResponse(_message.Message):
    __slots__ = ("accepted", "reason", "groups_queued", "groups_filtered", "problems_quarantined")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GROUPS_QUEUED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FILTERED_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    groups_queued: int
    groups_filtered: int
    problems_quarantined: int
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., groups_queued: _Optional[int] = ..., groups_filtered: _Optional[int] = ..., problems_quarantined: _Optional[int] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "worker_id", "lease_timeout_s", "client_source")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    worker_id: str
    lease_timeout_s: float
    client_source: ClientSource
    def __init__(self, lease_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., lease_timeout_s: _Optional[float] = ..., client_source: _Optional[_Union[ClientSource, str]] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("lease_deadline_unix_s", "problems")
    LEASE_DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    lease_deadline_unix_s: float
    problems: int
    def __init__(self, lease_deadline_unix_s: _Optional[float] = ..., problems: _Optional[int] = ...) -> None: ...

class TrajectoryGroup(_message.Message):
    __slots__ = ("group_id", "problem_id", "policy_version", "prompt_token_ids", "completions", "delivery_count", "reported_unix_s", "sampling_temperature", "sampling_top_p")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    REPORTED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_TOP_P_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    problem_id: str
    policy_version: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    delivery_count: int
    reported_unix_s: float
    sampling_temperature: float
    sampling_top_p: float
    def __init__(self, group_id: _Optional[str] = ..., problem_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., delivery_count: _Optional[int] = ..., reported_unix_s: _Optional[float] = ..., sampling_temperature: _Optional[float] = ..., sampling_top_p: _Optional[float] = ...) -> None: ...

class PullTrajectoriesRequest(_message.Message):
    __slots__ = ("max_groups", "wait_s", "consumer", "include_own_pending", "max_response_bytes", "learner_batch_groups")
    MAX_GROUPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_OWN_PENDING_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEARNER_BATCH_GROUPS_FIELD_NUMBER: _ClassVar[int]
    max_groups: int
    wait_s: float
    consumer: str
    include_own_pending: bool
    max_response_bytes: int
    learner_batch_groups: int
    def __init__(self, max_groups: _Optional[int] = ..., wait_s: _Optional[float] = ..., consumer: _Optional[str] = ..., include_own_pending: _Optional[bool] = ..., max_response_bytes: _Optional[int] = ..., learner_batch_groups: _Optional[int] = ...) -> None: ...

class PullTrajectoriesResponse(_message.Message):
    __slots__ = ("groups", "queue_depth")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[TrajectoryGroup]
    queue_depth: int
    def __init__(self, groups: _Optional[_Iterable[_Union[TrajectoryGroup, _Mapping]]] = ..., queue_depth: _Optional[int] = ...) -> None: ...

class AckTrajectoriesRequest(_message.Message):
    __slots__ = ("group_ids",)
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AckTrajectoriesResponse(_message.Message):
    __slots__ = ("acked", "unknown")
    ACKED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    acked: int
    unknown: int
    def __init__(self, acked: _Optional[int] = ..., unknown: _Optional[int] = ...) -> None: ...

class PublishPolicyRequest(_message.Message):
    __slots__ = ("version", "weights_uri")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_URI_FIELD_NUMBER: _ClassVar[int]
    version: int
    weights_uri: str
    def __init__(self, version: _Optional[int] = ..., weights_uri: _Optional[str] = ...) -> None: ...

class PublishPolicyResponse(_message.Message):
    __slots__ = ("version", "weights_uri")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_URI_FIELD_NUMBER: _ClassVar[int]
    version: int
    weights_uri: str
    def __init__(self, version: _Optional[int] = ..., weights_uri: _Optional[str] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("histogram_buckets",)
    HISTOGRAM_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    histogram_buckets: int
    def __init__(self, histogram_buckets: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("problems", "heap_size", "solved", "unsolved", "leased", "active_leases", "step", "policy_version", "weights_uri", "priority_histogram", "priority_bucket_edges", "groups_mixed", "groups_all_correct", "groups_all_wrong", "groups_constant", "effective_group_fraction", "forgetting_events", "breakthroughs", "lease_expiries", "queue_depth", "pending_groups", "completions_reported", "reward_sum", "late_reports", "groups_acked", "clients", "quarantined", "unseen")
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    HEAP_SIZE_FIELD_NUMBER: _ClassVar[int]
    SOLVED_FIELD_NUMBER: _ClassVar[int]
    UNSOLVED_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_URI_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_BUCKET_EDGES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_MIXED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_ALL_CORRECT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_ALL_WRONG_FIELD_NUMBER: _ClassVar[int]
    GROUPS_CONSTANT_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_GROUP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    FORGETTING_EVENTS_FIELD_NUMBER: _ClassVar[int]
    BREAKTHROUGHS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRIES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    PENDING_GROUPS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_REPORTED_FIELD_NUMBER: _ClassVar[int]
    REWARD_SUM_FIELD_NUMBER: _ClassVar[int]
    LATE_REPORTS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_ACKED_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    UNSEEN_FIELD_NUMBER: _ClassVar[int]
    problems: int
    heap_size: int
    solved: int
    unsolved: int
    leased: int
    active_leases: int
    step: int
    policy_version: int
    weights_uri: str
    priority_histogram: _containers.RepeatedScalarFieldContainer[int]
    priority_bucket_edges: _containers.RepeatedScalarFieldContainer[float]
    groups_mixed: int
    groups_all_correct: int
    groups_all_wrong: int
    groups_constant: int
    effective_group_fraction: float
    forgetting_events: int
    breakthroughs: int
    lease_expiries: int
    queue_depth: int
    pending_groups: int
    completions_reported: int
    reward_sum: float
    late_reports: int
    groups_acked: int
    clients: _containers.RepeatedCompositeFieldContainer[ClientStats]
    quarantined: int
    unseen: int
    def __init__(self, problems: _Optional[int] = ..., heap_size: _Optional[int] = ..., solved: _Optional[int] = ..., unsolved: _Optional[int] = ..., leased: _Optional[int] = ..., active_leases: _Optional[int] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., weights_uri: _Optional[str] = ..., priority_histogram: _Optional[_Iterable[int]] = ..., priority_bucket_edges: _Optional[_Iterable[float]] = ..., groups_mixed: _Optional[int] = ..., groups_all_correct: _Optional[int] = ..., groups_all_wrong: _Optional[int] = ..., groups_constant: _Optional[int] = ..., effective_group_fraction: _Optional[float] = ..., forgetting_events: _Optional[int] = ..., breakthroughs: _Optional[int] = ..., lease_expiries: _Optional[int] = ..., queue_depth: _Optional[int] = ..., pending_groups: _Optional[int] = ..., completions_reported: _Optional[int] = ..., reward_sum: _Optional[float] = ..., late_reports: _Optional[int] = ..., groups_acked: _Optional[int] = ..., clients: _Optional[_Iterable[_Union[ClientStats, _Mapping]]] = ..., quarantined: _Optional[int] = ..., unseen: _Optional[int] = ...) -> None: ...

class ClientStats(_message.Message):
    __slots__ = ("source", "leases", "problems_sampled", "groups", "groups_mixed", "completions", "reward_sum", "late_reports")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_MIXED_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    REWARD_SUM_FIELD_NUMBER: _ClassVar[int]
    LATE_REPORTS_FIELD_NUMBER: _ClassVar[int]
    source: ClientSource
    leases: int
    problems_sampled: int
    groups: int
    groups_mixed: int
    completions: int
    reward_sum: float
    late_reports: int
    def __init__(self, source: _Optional[_Union[ClientSource, str]] = ..., leases: _Optional[int] = ..., problems_sampled: _Optional[int] = ..., groups: _Optional[int] = ..., groups_mixed: _Optional[int] = ..., completions: _Optional[int] = ..., reward_sum: _Optional[float] = ..., late_reports: _Optional[int] = ...) -> None: ...
