from shared.routing import is_notifier_path


def test_notifier_paths_go_to_the_notifier() -> None:
    for path in (
        "/v1/webhook-endpoints",
        "/v1/webhook-endpoints/we_1",
        "/v1/webhook-endpoints/we_1/rotate-secret",
        "/v1/webhook-deliveries",
        "/v1/webhook-deliveries/whd_1/replay",
        "/v1/notifier/openapi.json",
    ):
        assert is_notifier_path(path), path


def test_everything_else_goes_to_core() -> None:
    for path in ("/v1/chains", "/v1/webhook-endpointsX", "/v1/openapi.json", "/v1/notifier", "/"):
        assert not is_notifier_path(path), path
