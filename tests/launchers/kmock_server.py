"""Run kmock's KubernetesEmulator in a background thread so that SYNC clients
(official `kubernetes` client, KubernetesHook) can talk to it without blocking
the server's event loop.

Usage:
    with KmockThread() as km:
        print(km.url)            # e.g. http://127.0.0.1:41234
        km.emulator.objects      # kmock's in-memory object store (thread-unsafe; read-mostly)
"""
from __future__ import annotations

import asyncio
import datetime
import uuid
import re
import threading

import logging

import kmock

logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one INFO line per request otherwise


def _match_selector(labels: dict, selector: str) -> bool:
    """Minimal K8s label selector: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""
    labels = labels or {}
    for term in re.split(r",(?![^()]*\))", selector or ""):
        term = term.strip()
        if not term:
            continue
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, vals = m[1], m[2], {v.strip() for v in m[3].split(",")}
            ok = labels.get(key) in vals if op == "in" else labels.get(key) not in vals
        elif "!=" in term:
            key, val = (x.strip() for x in term.split("!=", 1))
            ok = labels.get(key) != val
        elif "=" in term:
            key, val = (x.strip() for x in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == val
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


class LabelSelectingEmulator(kmock.KubernetesEmulator):
    """Fixes for kmock 0.8 gaps:
    * LIST and WATCH ignore ?labelSelector=  -> filter items/events here;
    * the python clients send ?watch=True (capital T) but kmock only recognises watch=true,
      so watches were served as a LIST (the client's Watch then yields nothing) -> re-classify;
    * CREATE stores the body verbatim: add metadata.namespace/uid/creationTimestamp;
    * DELETE on a collection (delete_collection_namespaced_*) -> 404 -> emulate it.
    """

    async def _serve_watch(self, request):
        selector = request.params.get("labelSelector")
        async for ev in super()._serve_watch(request):
            if (selector and isinstance(ev, dict) and not _match_selector(
                    ev.get("object", {}).get("metadata", {}).get("labels"), selector)):
                continue
            yield ev

    async def _handle(self, request):
        if (request.action == kmock.action.CREATE and request.resource is not None
                and isinstance(request.data, dict)):
            # kmock stores the body verbatim. Fill what a real apiserver would: without
            # metadata.namespace, namespaced WATCHes silently drop the object's events.
            meta = request.data.setdefault("metadata", {})
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp",
                            datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        if request.action == kmock.action.LIST and request.params.get("watch", "").lower() == "true":
            object.__setattr__(request, "action", kmock.action.WATCH)  # Request is a frozen attrs class
        if (request.method == kmock.method.DELETE and request.resource is not None
                and request.name is None):
            return await self._delete_collection(request)
        return await super()._handle(request)

    async def _delete_collection(self, request):
        import aiohttp.web
        selector = request.params.get("labelSelector", "")
        deleted = []
        for (res, ns, name), obj in list(self.objects.items()):
            if res != request.resource or obj.deleted:
                continue
            if request.namespace is not None and ns != request.namespace:
                continue
            if not _match_selector(obj.get("metadata", {}).get("labels"), selector):
                continue
            raw = obj.raw
            obj.delete()
            await self._buses[res].put({"type": "DELETED", "object": raw})
            deleted.append(raw)
        return aiohttp.web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
             "details": {"deleted": len(deleted)}})

    async def _serve_list(self, request):
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            result["items"] = [o for o in result["items"]
                               if _match_selector(o.get("metadata", {}).get("labels"), selector)]
        return result


class KmockThread:
    def __init__(self, host: str = "127.0.0.1", port: int | None = None,
                 cls: type[kmock.KubernetesEmulator] = LabelSelectingEmulator):
        self._host, self._port, self._cls = host, port, cls
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.emulator: kmock.KubernetesEmulator | None = None
        self.server: kmock.Server | None = None
        self.url: str = ""

    async def _main(self) -> None:
        try:
            self._stop = asyncio.Event()
            emulator = self._cls()
            emulator.resources.load_bundled()  # WITHOUT this, list/discovery -> 404
            async with emulator, kmock.Server(emulator, host=self._host, port=self._port) as srv:
                self.emulator, self.server = emulator, srv
                self.url = str(srv.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()
                # Open watch streams never end by themselves (timeoutSeconds is ignored) and
                # would block the server shutdown: cancel every other task of this loop first.
                me = asyncio.current_task()
                others = [t for t in asyncio.all_tasks() if t is not me]
                for t in others:
                    t.cancel()
                await asyncio.gather(*others, return_exceptions=True)
        except BaseException as e:  # surface startup errors to the caller
            self._error = e
            self._ready.set()
            raise

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        except BaseException:
            pass
        finally:
            self._loop.close()

    def call(self, fn, *args, **kwargs):
        """Run a plain function inside the server's loop thread (safe way to mutate emulator.objects)."""
        async def _wrap():
            return fn(*args, **kwargs)
        return asyncio.run_coroutine_threadsafe(_wrap(), self._loop).result(10)

    def __enter__(self) -> "KmockThread":
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("kmock did not start in 10s")
        if self._error:
            raise RuntimeError("kmock failed to start") from self._error
        return self

    def __exit__(self, *exc) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(10)
