"""What the relay does with a request of the store protocol, apart from how
it travels: :class:`RequestHandler`.

The relay's server (:mod:`hpo.store._relay`) reads the requests, writes a
round's records durably and sends the answers; this module decides what
each request may write and what its answer says, from the study's ledger
(:mod:`hpo.store._ledger`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hpo.store._control import ControlFile
from hpo.store._format import reported
from hpo.store._ledger import JournalLedger, Ledger, Pruning
from hpo.store._protocol import HEADER, Decision, MalformedRequest, check_request, encode
from hpo.store._writes import Write, journal_records, writes_of
from hpo.store.records import RUN_ATTR, EventRecord, TrialStatus, attempt_open, begin_attempt

__all__ = ["RequestHandler", "refusal"]

_WORKER_ID = "hpo-relay"  # the journal's worker id of the records the relay writes for trials

Peer = Any  # the server's connection: answers go back to it, never looked into here
Send = Callable[[Peer, dict[str, Any]], None]


class RequestHandler:
    """The handling of each request against the study's ledger.

    :meth:`admit` checks a request against the protocol and the ledger (its
    trial unfinished, its attempt the current one) and says what it writes;
    :meth:`answer` answers it once its round is durable, with the master's
    decisions (stop, contender, resize) and its pruner's; :meth:`follow`
    keeps the ledger up with every record of the journal, and
    :meth:`publish` the control file with the decisions. A slow pruner is
    asked off the relay's thread, its answer handed to ``later``.

    It never touches a socket or the journal: answers go out through
    ``send`` (an answer) and ``send_frame`` (a frame made already).
    """

    def __init__(self, ledger: Ledger, pruning: Pruning | None, control: ControlFile | None, *,
                 send: Send, send_frame: Callable[[Peer, bytes], None], later: Send) -> None:
        self.ledger, self.pruning, self._control = ledger, pruning, control
        self._send, self._send_frame, self._later = send, send_frame, later
        self._decider = ThreadPoolExecutor(1, "hpo-pruner") if pruning is not None and pruning.slow else None

    def close(self) -> None:
        """Ask the slow pruner nothing more."""
        if self._decider is not None:
            self._decider.shutdown(wait=False, cancel_futures=True)

    # -- before the round is written -------------------------------------------------

    def admit(self, message: dict[str, Any]) -> tuple[dict[str, Any] | None, list[Write] | None]:
        """The answer to send now (a refusal, or a start's), and the writes
        to make (None: none). A request that breaks the protocol is refused
        alone: the relay goes on."""
        try:
            return self._admit(message)
        except MalformedRequest as exc:
            return refusal(message, error=f"malformed request: {exc}"), None
        except (KeyError, ValueError, TypeError) as exc:
            return refusal(message, error=f"malformed request: {type(exc).__name__}: {exc}"), None

    def records(self, writes: list[Write]) -> list[dict[str, Any]]:
        """The journal records of a request's writes, followed by the ledger
        as the round will commit them."""
        new = journal_records(writes, _WORKER_ID)
        self.follow(new)
        return new

    def follow(self, records: list[dict[str, Any]]) -> None:
        """Records of the journal, in its order, as the ledger must know them."""
        ledger = self.ledger
        if isinstance(ledger, JournalLedger):
            for record in records:
                ledger.apply(record)

    def follow_foreign(self, records: list[dict[str, Any]]) -> None:
        """Records other processes appended directly: followed, and their
        reports judged by a fast pruner (the control file tells them)."""
        self.follow(records)
        if self.pruning is None or self.pruning.slow:
            return
        for trial_id, step in filter(None, map(reported, records)):
            if trial_id not in self.ledger.pruned:
                self._prune(trial_id, step)

    def _admit(self, message: dict[str, Any]) -> tuple[dict[str, Any] | None, list[Write] | None]:
        check_request(message)
        trial_id = message["trial"]
        ended = self.ledger.ended(trial_id)
        if ended is not None:
            return refusal(message, halt="ended", status=ended[0], value=ended[1]), None
        view = self.ledger.live(trial_id)
        if view is None:
            return refusal(message, halt="unknown"), None
        if message["op"] == "poll" and message.get("run") is None:  # only: is it still live?
            return {"id": message.get("id"), "ok": True}, None
        token = str(message["run"])
        if message["op"] == "start":
            return self._start(message, view, token)
        if view.run.get("token") != token or not attempt_open(view.run):
            return refusal(message, halt="superseded"), None
        if message["op"] == "end":
            self._check_values(message.get("values"))
        return None, writes_of(message)

    def _check_values(self, values: list[float] | None) -> None:
        """One value per objective of the study, as Optuna stores a trial's."""
        objectives = self.ledger.objectives()
        if values is not None and objectives is not None and len(values) != objectives:
            raise MalformedRequest("values", f"must hold {objectives} finite number(s), one per "
                                             f"objective of the study, not {len(values)}")

    def _start(self, message: dict[str, Any], view: Any,
               token: str) -> tuple[dict[str, Any], list[Write]]:
        events: list[tuple[str, EventRecord]]
        if view.run.get("token") == token and attempt_open(view.run):  # asked again
            run, events = view.run, []
        else:
            run, events = begin_attempt(view.run, view.heartbeat, dict(message["where"]),
                                        float(message["now"]), float(message["gpus"]), token)
        known_reports, known_segments = (int(n) for n in message.get("knows") or (0, 0))
        reports = [[step, view.reports[step]] for step in sorted(view.reports)]
        segments = [view.segments[index] for index in sorted(view.segments)]
        answer = {"id": message.get("id"), "ok": True, "run": run,
                  "reports": reports[known_reports:], "segments": segments[known_segments:]}
        writes: list[Write] = [("attr", view.trial_id, key, event) for key, event in events]
        writes += [("attr", view.trial_id, RUN_ATTR, run), ("state", view.trial_id, TrialStatus.RUNNING, None)]
        return answer, writes

    # -- once it is durable ------------------------------------------------------------

    def stored(self, writes: list[Write], ok: bool) -> None:
        """A database made a request's writes (``ok``), or refused them: the
        trial had ended meanwhile."""
        if ok:
            self.ledger.wrote(writes)
        else:
            self.ledger.refused(writes[0][1])

    def answer(self, peer: Peer, message: dict[str, Any], stored: bool) -> None:
        """Answer a request whose writes were made (``stored``) or refused."""
        trial_id = int(message["trial"])
        if message["op"] == "end" and message["status"] != TrialStatus.SUSPENDED.value:
            ended = self.ledger.ended(trial_id)
            won = stored and ended is not None and ended[0] == message["status"]
            self._send(peer, {"id": message.get("id"), "ok": True, "won": won,
                              "status": ended[0] if ended else None,
                              "value": ended[1] if ended else None})
            return
        if not stored:
            status, value = self.ledger.ended(trial_id) or (None, None)
            self._send(peer, refusal(message, halt="ended", status=status, value=value))
            return
        step = message.get("step") if message["op"] == "report" else None
        if step is not None and self._decider is not None:  # a slow pruner: off this thread
            self._decider.submit(self._decide_later, peer, message, trial_id, int(step))
            return
        wire = self._decision(trial_id, None if step is None else int(step)).to_wire()
        if not wire:  # nothing to do, the usual answer: made without the encoder
            self._send_frame(peer, _plain_ok(message.get("id")))
        else:
            self._send(peer, {"id": message.get("id"), "ok": True, **wire})

    def _decision(self, trial_id: int, step: int | None) -> Decision:
        study = self.ledger.study()
        pruned = self.ledger.pruned.get(trial_id)
        if pruned is None and step is not None and self.pruning is not None:
            pruned = self._prune(trial_id, step)
        return Decision(stop=study.stop, prune=pruned, resize=study.resize.get(str(trial_id)),
                        contender=study.contender)

    def _prune(self, trial_id: int, step: int) -> str | None:
        view = self.ledger.live(trial_id)
        if view is None or self.pruning is None:
            return None
        why = self.pruning.decide(trial_id, view.number, step, view.values)
        if why is not None:
            self.ledger.pruned[trial_id] = why
        return why

    def _decide_later(self, peer: Peer, message: dict[str, Any], trial_id: int, step: int) -> None:
        try:
            decision = self._decision(trial_id, step)
            answer = {"id": message.get("id"), "ok": True, **decision.to_wire()}
        except Exception as exc:  # the user's pruner failed: the trial goes on, and says why
            answer = {"id": message.get("id"), "ok": True, "prune_error": f"{type(exc).__name__}: {exc}"}
        self._later(peer, answer)

    def publish(self, epoch: int) -> None:
        """Rewrite the control file when the study's decisions changed."""
        if self._control is None:
            return
        study = self.ledger.study()
        wire = Decision(stop=study.stop, contender=study.contender).to_wire()
        pruned = dict(self.ledger.pruned)  # one copy: a slow pruner's thread adds to it
        self._control.write(epoch, {**wire, "resize": study.resize,
                                    "prune": {str(k): v for k, v in pruned.items()}})


def refusal(message: dict[str, Any], halt: str | None = None, error: str | None = None,
            **details: Any) -> dict[str, Any]:
    """The answer refusing ``message``: the attempt must ``halt`` (and why), or an ``error``."""
    number = message.get("id")  # a malformed one is not echoed: it may not encode
    answer: dict[str, Any] = {"id": number if type(number) is int else None, "ok": False}
    if halt is not None:
        answer["halt"] = halt
        answer.update(details)
    else:
        answer["error"] = error
    return answer


def _plain_ok(number: Any) -> bytes:
    """The frame of ``{"id": N, "ok": true}``."""
    payload = (b'{"id":%d,"ok":true}' % number if isinstance(number, int)
               else encode({"id": number, "ok": True})[HEADER.size:])
    return HEADER.pack(len(payload)) + payload
