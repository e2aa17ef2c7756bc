"""The server's settings: validated, and a named token variable that is empty never serves without auth."""

from __future__ import annotations

import pytest

from flows.serving.server import ServeConfig


def test_the_token_comes_from_the_named_variable_and_an_empty_one_is_an_error(monkeypatch):
    assert ServeConfig().auth_token() is None and ServeConfig().host == "127.0.0.1"
    monkeypatch.setenv("SCORER_T", "abc")
    assert ServeConfig(auth_token_env="SCORER_T").auth_token() == "abc"
    monkeypatch.setenv("SCORER_T", "")
    with pytest.raises(ValueError, match="SCORER_T: that environment variable is unset or empty"):
        ServeConfig(auth_token_env="SCORER_T").auth_token()


@pytest.mark.parametrize(("kwargs", "message"), [({"port": 70000}, "--port"), ({"reload_every_s": 0}, "--reload-every"),
                                                  ({"max_batch_rows": 0}, "max_batch_rows")])
def test_bad_settings_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServeConfig(**kwargs)
