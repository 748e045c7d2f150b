"""The HTTP retriever against a real local server (serving BM25), and its failure modes."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from kair_runtime.config import RetrieverConfig
from kair_runtime.retrieval import build_retriever
from kair_runtime.retrieval.base import load_corpus
from kair_runtime.retrieval.bm25 import BM25Retriever
from kair_runtime.retrieval.remote import RemoteRetrievalError, RemoteRetriever, make_server


@pytest.fixture(scope="module")
def local(corpus_file) -> BM25Retriever:
    return BM25Retriever.from_passages(load_corpus(corpus_file))


@pytest.fixture(scope="module")
def url(local):
    server = make_server(local, port=0)  # 127.0.0.1, a free port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_remote_results_equal_local_results(url, local, obvious):
    remote = build_retriever(RetrieverConfig(kind="remote", url=url, timeout_s=5.0))
    queries = [q for q, _ in obvious] + ["", "the of"]
    got, want = remote.search(queries, 3), local.search(queries, 3)
    assert [[(p.id, p.title, p.text, round(p.score, 5)) for p in r] for r in got] == \
           [[(p.id, p.title, p.text, round(p.score, 5)) for p in r] for r in want]
    assert got[-2:] == [[], []] and remote.search([], 3) == []
    assert httpx.get(f"{url}/health").json() == {"status": "ok", "retriever": "bm25"}


def test_bad_requests_get_a_400_that_says_why(url):
    remote = RemoteRetriever(url, timeout_s=5.0)
    with pytest.raises(RemoteRetrievalError, match=r'HTTP 400: .*\\"k\\" must be an integer >= 1'):
        remote.search(["lake"], 0)
    r = httpx.post(f"{url}/search", content=b"not json")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    r = httpx.post(f"{url}/search", json={"queries": "lake", "k": 2})
    assert r.status_code == 400 and "list of strings" in r.json()["error"]
    assert httpx.post(f"{url}/other", json={}).status_code == 404


def test_unreachable_server_is_a_clear_error():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RemoteRetrievalError, match=rf"127.0.0.1:{port}/search is unreachable"):
        RemoteRetriever(f"http://127.0.0.1:{port}", timeout_s=2.0).search(["lake"], 3)


def test_a_server_that_never_answers_times_out():
    with socket.socket() as s:  # accepts connections (backlog) but never replies
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(RemoteRetrievalError, match=r"did not answer within 0.3s"):
            RemoteRetriever(f"http://127.0.0.1:{port}", timeout_s=0.3).search(["lake"], 3)


def test_remote_needs_a_url():
    with pytest.raises(ValueError, match="retriever.url is required"):
        RemoteRetriever.from_config(RetrieverConfig(kind="remote"))
