"""Where the operator's cluster credentials come from: the `kubernetes` package's loaders.

Those loaders know every way a cluster hands out credentials (docs/architecture.md, "Credentials"):
the in-cluster service account (whose projected token the kubelet rotates; the loader re-reads the
file every minute), and kubeconfig files with inline or file tokens, client certificates and exec
plugins (cloud logins that expire and refresh). Nothing here reads a token once and keeps it: the
Authorization header is asked for on every request (`authorization()` runs the loader's refresh
hook), and a 401 makes the caller log in again from scratch (`login()`).

kopf needs credentials too: `connection_info()` hands the same login to kopf's login handler, so
kopf's watches and our own requests always use one identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import kopf
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config


class NoCredentials(Exception):
    """Neither an in-cluster service account nor a usable kubeconfig."""


@dataclass
class Login:
    """One login: the loaded configuration, whose hook refreshes expiring tokens."""

    configuration: k8s_client.Configuration

    @property
    def server(self) -> str:
        return self.configuration.host.rstrip("/")

    def authorization(self) -> str | None:
        """The Authorization header value now (refreshed by the loader when due), or None."""
        token = (self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization") or "").strip()
        if token:  # stripped: a token file's trailing newline would be a forbidden header character
            return token if " " in token else f"Bearer {token}"
        if self.configuration.username:
            return self.configuration.get_basic_auth_token()
        return None


def login(kubeconfig: str | None = None) -> Login:
    """In-cluster service account first, then the kubeconfig ($KUBECONFIG or ~/.kube/config).

    `kubeconfig` given: that file only (tests, and tools pointed at one cluster).
    """
    configuration = k8s_client.Configuration()
    in_cluster_error: Exception = k8s_config.ConfigException("skipped: a kubeconfig file was given")
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
            return Login(configuration)
        except k8s_config.ConfigException as error:
            in_cluster_error = error
    try:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration, persist_config=False)
    except (k8s_config.ConfigException, OSError) as error:
        raise NoCredentials(
            f"no cluster credentials: not in a pod with a service account ({in_cluster_error}), and no usable "
            f"kubeconfig ({error}); run in-cluster, or set KUBECONFIG to a kubeconfig file"
        ) from error
    return Login(configuration)


def connection_info(current: Login) -> kopf.ConnectionInfo:
    """The same login in kopf's terms, for its `@kopf.on.login` handler."""
    configuration = current.configuration
    scheme, _, token = (current.authorization() or "").partition(" ")
    basic = scheme.lower() == "basic"
    return kopf.ConnectionInfo(
        server=current.server,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=None if basic or not token else scheme,
        token=None if basic or not token else token,
        username=configuration.username if basic else None,
        password=configuration.password if basic else None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )
