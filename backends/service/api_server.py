"""The local API's public names, from where they used to live (now :mod:`backends.service.api`).

Kept so that importers of ``backends.service.api_server`` keep working; new code imports
from the package's modules (``api.app``, ``api.jobs``, ``api.worker``, ...) directly.
"""

from __future__ import annotations

from backends.service.api.app import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    MAX_BODY_BYTES,
    ApiServer,
    ServerSettings,
)
from backends.service.api.errors import ApiError
from backends.service.api.host import ApiHost
from backends.service.api.jobs import (
    MAX_QUEUED_REQUESTS,
    ApiJob,
    GenerationBackend,
    JobEvent,
    JobFailed,
    JobStarted,
    RequestCounts,
    ServedModel,
    job_failed,
)
from backends.service.api.parsing import (
    MAX_STOP_STRINGS,
    Endpoint,
    ParsedRequest,
    parse_messages,
    parse_request,
)
from backends.service.api.wire import llama_timings, lmstudio_stats, origins, usage
from backends.service.api.worker import PairWorker, run_job

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "MAX_BODY_BYTES",
    "MAX_QUEUED_REQUESTS",
    "MAX_STOP_STRINGS",
    "ApiError",
    "ApiHost",
    "ApiJob",
    "ApiServer",
    "Endpoint",
    "GenerationBackend",
    "JobEvent",
    "JobFailed",
    "JobStarted",
    "ParsedRequest",
    "PairWorker",
    "RequestCounts",
    "ServedModel",
    "ServerSettings",
    "job_failed",
    "llama_timings",
    "lmstudio_stats",
    "origins",
    "parse_messages",
    "parse_request",
    "run_job",
    "usage",
]
