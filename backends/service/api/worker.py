"""The thread that owns a loaded pair and runs the API's jobs on it, one at a time.

:func:`run_job` generates one job on a pair (the engine process runs it too, between the
window's commands); :class:`PairWorker` is ``specdeck serve``'s backend: it loads the pair
on its thread, then serves the queue until stopped.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

from backends.errors import ContextOverflowError, SpecDeckError
from backends.service.api.errors import ApiError
from backends.service.api.jobs import (
    MAX_QUEUED_REQUESTS,
    ApiJob,
    JobStarted,
    RequestCounts,
    job_failed,
)
from backends.speculation.types import SpeculationStats

if TYPE_CHECKING:
    from collections.abc import Callable

    from backends.service.api.jobs import ServedModel
    from backends.service.loaded_pair import LoadedPair
    from backends.speculation.methods import SpeculationMethod
    from backends.speculation.types import GenerationUpdate

log = logging.getLogger("backends.service.api")


def run_job(
    pair: LoadedPair,
    job: ApiJob,
    method: SpeculationMethod,
    observe: Callable[[int, GenerationUpdate], None] | None = None,
) -> SpeculationStats:
    """Generate one job on a loaded pair, delivering its events; returns the final stats.

    The prompt is the main model's chat template over the messages (chat completions) or
    the raw text (completions); one that does not fit the context is an error. ``observe``
    sees (prompt tokens, update) for every round too (the window's meter, a log).
    """
    if job.cancel.is_set():
        raise ApiError(499, "the client went away before its turn")
    decoder = pair.decoder(job.method or method, job.settings.p_min)
    if job.messages is not None:
        prompt = decoder.prompt_tokens(job.messages, job.tools)
    else:
        assert job.text is not None
        prompt = pair.main.tokenize(job.text, add_special=True, parse_special=False)
    n_ctx = pair.main.n_ctx
    if len(prompt) >= n_ctx:
        raise ContextOverflowError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}; "
            "shorten it or load the model with a larger context"
        )
    job.deliver(JobStarted(len(prompt)))
    stats = SpeculationStats()
    for update in decoder.generate(prompt, job.settings, job.cancel):
        stats = update.stats
        job.deliver(update)
        if observe is not None:
            observe(len(prompt), update)
    return stats


class PairWorker:
    """A generation backend that runs jobs one at a time on its own thread.

    ``load`` runs on the worker thread first (the API answers 503 until it is done); then
    each queued job is tokenized, checked against the context and generated with the
    pair's decoder for its method.
    """

    def __init__(
        self,
        load: Callable[[], Any],
        *,
        method: SpeculationMethod,
        max_queued: int = MAX_QUEUED_REQUESTS,
        on_finished: Callable[[ApiJob, SpeculationStats], None] | None = None,
        on_load_failed: Callable[[str], None] | None = None,
    ) -> None:
        self._load = load
        self._method = method
        self._jobs: queue.Queue[ApiJob | None] = queue.Queue()
        self.counts = RequestCounts(max_queued)
        self._pair: LoadedPair | None = None
        self._main: ServedModel | None = None
        self._draft: ServedModel | None = None
        self._problem: str | None = "the models are still loading"
        self._on_finished = on_finished
        self.on_load_failed = on_load_failed  # told why, once, when loading fails
        self._thread = threading.Thread(target=self._work, name="generation", daemon=True)

    def start(self) -> None:
        """Start loading, then serving jobs."""
        self._thread.start()

    def stop(self) -> None:
        """Finish the running job, then stop and free the models."""
        if not self._thread.is_alive():
            return
        self._jobs.put(None)
        self._thread.join()

    @property
    def main(self) -> ServedModel | None:
        return self._main

    @property
    def draft(self) -> ServedModel | None:
        return self._draft

    @property
    def n_ctx(self) -> int:
        return self._pair.main.n_ctx if self._pair is not None else 0

    @property
    def method(self) -> SpeculationMethod:
        return self._method

    @property
    def unavailable(self) -> str | None:
        return self._problem

    def submit(self, job: ApiJob) -> None:
        if self._problem is not None:
            raise ApiError(503, self._problem, error_type="server_error")
        self.counts.admit()
        self._jobs.put(job)

    def _work(self) -> None:
        try:
            self._pair, self._main, self._draft = self._load()
        except Exception as error:  # noqa: BLE001 - said in every answer from now on
            if not isinstance(error, SpecDeckError):
                log.exception("loading failed")
            self._problem = f"the models could not be loaded: {error}"
            if self.on_load_failed is not None:
                self.on_load_failed(self._problem)
            return
        self._problem = None
        try:
            while (job := self._jobs.get()) is not None:
                stats: SpeculationStats | None = None
                try:
                    stats = run_job(self._pair, job, self._method)
                    if self._on_finished is not None:
                        self._on_finished(job, stats)
                except BaseException as error:  # noqa: BLE001 - the next job must run
                    if not isinstance(error, SpecDeckError | ApiError):
                        log.exception("a request failed")
                    job.deliver(job_failed(error))
                finally:
                    self.counts.finished(stats)
        finally:
            self._problem = "the server is stopping"
            self._pair.close()
