"""SpecDeck's OpenAI-compatible HTTP API: the loaded pair, served to other programs.

Endpoints, as OpenAI, LM Studio and llama.cpp's ``llama-server`` name them:
``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed
(server-sent events ending in ``data: [DONE]``) or not. Every answer carries LM Studio's
``stats`` (tok/s, time to first token, the four draft-token counts, the stop reason) and
llama.cpp's ``timings`` (``predicted_per_second``, ``draft_n``, ``draft_n_accepted``);
every streamed chunk carries, in a ``specdeck`` field, who produced each of its tokens
(``draft``: drafted and accepted; ``target``: the main model's own), so that a client can
colour accepted draft tokens as the window does.

Requests go to one :class:`~backends.service.api.jobs.GenerationBackend` that generates
one at a time (a queue; its length is in ``/v1/models``'s ``specdeck`` field). aiohttp
serves them: one well-kept package brings the server, streamed responses and a test
client, with no ASGI stack to assemble, and its handlers notice a client that went away
on the next write, so a dropped stream cancels its generation within one round.

Safe by default: the server binds 127.0.0.1; another address needs an API key, and with
a key every request without ``Authorization: Bearer <key>`` gets 401. Bodies are bounded
(1 MiB), ``max_tokens`` by the context, and CORS is off unless origins are given. Bad
requests get OpenAI's error shape (``{"error": {"message", "type", "param", "code"}}``)
and a 4xx status with a one-line message.

One job a module, read in this order:

- :mod:`.errors`: :class:`ApiError`, a refusal in OpenAI's error shape;
- :mod:`.jobs`: what the HTTP side hands the generating side (jobs and their events, the
  backend a server needs, admission to the bounded queue);
- :mod:`.parsing`: request bodies → checked requests, their options resolved over the
  server's defaults by :func:`backends.service.generation_options.generation_settings`;
- :mod:`.wire`: OpenAI's wire format (envelopes, choices, usage, LM Studio's stats,
  llama.cpp's timings, server-sent events);
- :mod:`.app`: the aiohttp application (routes, auth, CORS, the handlers);
- :mod:`.worker`: the thread that owns a loaded pair and runs the jobs (``specdeck serve``);
- :mod:`.host`: an application listening from a thread of its own (the engine process).
"""
