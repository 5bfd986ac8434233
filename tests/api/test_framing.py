"""No page of the server may be framed by another site (issue #37, 7c: the dashboard could be):
every answer carries ``Content-Security-Policy: frame-ancestors 'none'`` and ``X-Frame-Options: DENY``,
the API docs' own policy included, and the refusals of the middleware before any route."""

from __future__ import annotations

import pytest

from api.framing import with_frame_policy

TABLE = {"model": "tiny-bert", "backend": "estimate", "seq_lens": [32], "modes": ["fp32"], "gpu": "T4"}


def frame_directives(response) -> set[str]:
    policy = response.headers.get("content-security-policy", "")
    return {d.strip() for d in policy.split(";") if d.strip().startswith("frame-ancestors")}


def assert_unframeable(response):
    assert frame_directives(response) == {"frame-ancestors 'none'"}, response.headers
    assert response.headers.get_list("x-frame-options") == ["DENY"]


@pytest.mark.parametrize("path", ["/", "/runs", "/new", "/compare", "/fleet", "/docs", "/redoc",
                                  "/docs/oauth2-redirect", "/openapi.json", "/v1/health", "/v1/tables",
                                  "/runs/no-such-run", "/static/no-such-file"])
def test_every_page_forbids_framing(idle_client, path):
    assert_unframeable(idle_client.get(path))


def test_a_run_page_and_its_parts_forbid_framing(idle_client):
    run_id = idle_client.post("/v1/tables", json=TABLE).json()["id"]
    for path in (f"/runs/{run_id}", f"/runs/{run_id}/live", f"/v1/tables/{run_id}"):
        response = idle_client.get(path)
        assert response.status_code == 200
        assert_unframeable(response)


def test_the_refusals_before_any_route_forbid_framing_too(idle_client):
    assert_unframeable(idle_client.get("/", headers={"Host": "attacker.example"}))  # 400
    assert_unframeable(idle_client.post("/v1/tables", content=b"x" * 100_000))  # 413


def test_the_docs_keep_their_policy_and_gain_frame_ancestors(idle_client):
    policy = idle_client.get("/docs").headers["content-security-policy"]
    assert policy.startswith("default-src 'self'") and policy.endswith("; frame-ancestors 'none'")


def test_with_frame_policy_adds_to_a_policy_and_overrides_looser_framing_rules():
    assert with_frame_policy([(b"x-frame-options", b"SAMEORIGIN")]) == [
        (b"content-security-policy", b"frame-ancestors 'none'"), (b"x-frame-options", b"DENY")]
    own = [(b"Content-Security-Policy", b"default-src 'self'; frame-ancestors 'self' https://a.example;")]
    framed = with_frame_policy(own)
    assert framed[0] == (b"Content-Security-Policy", b"default-src 'self'; frame-ancestors 'none'")
    assert framed[1:] == [(b"x-frame-options", b"DENY")]
