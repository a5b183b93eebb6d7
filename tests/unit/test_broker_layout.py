"""The local cluster's layout and generated configuration, without starting Kafka."""

from __future__ import annotations

import pytest

from broker.cluster import Layout, LocalCluster, Node
from broker.errors import BrokerError


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_three_nodes_get_consecutive_client_then_controller_ports(tmp_path):
    layout = LocalCluster(tmp_path)._plan(3, 19092)
    assert [n.port for n in layout.nodes] == [19092, 19093, 19094]
    assert [n.controller_port for n in layout.nodes] == [19095, 19096, 19097]
    assert layout.bootstrap_servers == "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"


def test_base_port_zero_picks_distinct_free_ports(tmp_path):
    layout = LocalCluster(tmp_path)._plan(3, 0)
    ports = [p for n in layout.nodes for p in (n.port, n.controller_port)]
    assert len(set(ports)) == 6 and all(p > 0 for p in ports)


def test_only_one_or_three_brokers(tmp_path):
    with pytest.raises(BrokerError, match="1 or 3"):
        LocalCluster(tmp_path)._plan(2, 0)


def test_layout_survives_a_json_round_trip():
    layout = Layout("abc", "4.1.1", (Node(1, 1, 2), Node(2, 3, 4)))
    assert Layout.from_json(layout.to_json()) == layout


def test_three_node_config_replicates_three_times_with_two_in_sync(tmp_path):
    cluster = LocalCluster(tmp_path)
    layout = cluster._plan(3, 20000)
    cluster._write_node_files(layout, layout.nodes[1])
    props = _props((cluster.node_dir(2) / "server.properties").read_text())
    assert props["node.id"] == "2"
    assert props["default.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:20003,2@127.0.0.1:20004,3@127.0.0.1:20005"
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:20001,CONTROLLER://127.0.0.1:20004"
    assert props["unclean.leader.election.enable"] == "false"


def test_single_node_config_replicates_once(tmp_path):
    cluster = LocalCluster(tmp_path)
    layout = cluster._plan(1, 21000)
    cluster._write_node_files(layout, layout.nodes[0])
    props = _props((cluster.node_dir(1) / "server.properties").read_text())
    assert props["default.replication.factor"] == "1"
    assert props["min.insync.replicas"] == "1"
    assert all(v.startswith("127.0.0.1") or "127.0.0.1" in v
               for k, v in props.items() if k.endswith("listeners"))


def test_nodes_given_hosts_listen_advertise_and_vote_on_them(tmp_path):
    cluster = LocalCluster(tmp_path)
    hosts = ("10.77.0.1", "10.77.0.2", "10.77.0.3")
    layout = cluster._plan(3, 9092, hosts=hosts)
    assert layout.bootstrap_servers == "10.77.0.1:9092,10.77.0.2:9093,10.77.0.3:9094"
    assert Layout.from_json(layout.to_json()) == layout
    cluster._write_node_files(layout, layout.nodes[1])
    props = _props((cluster.node_dir(2) / "server.properties").read_text())
    assert props["listeners"] == "PLAINTEXT://10.77.0.2:9093,CONTROLLER://10.77.0.2:9096"
    assert props["advertised.listeners"] == "PLAINTEXT://10.77.0.2:9093"
    assert props["controller.quorum.voters"] == (
        "1@10.77.0.1:9095,2@10.77.0.2:9096,3@10.77.0.3:9097")


def test_a_layout_written_before_hosts_reads_as_loopback():
    layout = Layout.from_json('{"cluster_id": "c", "kafka_version": "4.1.1", "nodes": '
                              '[{"node_id": 1, "port": 9092, "controller_port": 9093}]}')
    assert layout.bootstrap_servers == "127.0.0.1:9092"


def test_hosts_refused_for_a_secured_cluster_or_in_the_wrong_number(tmp_path):
    with pytest.raises(BrokerError, match="listens on 127.0.0.1 only"):
        LocalCluster(tmp_path)._plan(1, 9092, "sasl_ssl", hosts=("10.77.0.1",))
    with pytest.raises(BrokerError, match="1 host"):
        LocalCluster(tmp_path)._plan(3, 9092, hosts=("10.77.0.1",))


def test_an_address_not_of_this_host_is_named_not_called_busy(tmp_path):
    cluster = LocalCluster(tmp_path)
    with pytest.raises(BrokerError, match="192.0.2.1 is not an address of this host"):
        cluster.up(1, 9092, hosts=("192.0.2.1",))


def test_a_stale_pid_file_is_not_a_running_broker(tmp_path):
    cluster = LocalCluster(tmp_path)
    layout = cluster._plan(1, 0)
    cluster.layout_file.write_text(layout.to_json())
    cluster.node_dir(1).mkdir()
    (cluster.node_dir(1) / "pid").write_text("1\n")   # pid 1 is alive but is not our Kafka
    assert cluster.pid(1) is None
    assert cluster.running_nodes() == []
    assert cluster.status()[0]["state"] == "stopped"


def test_cluster_ids_never_start_with_a_dash(monkeypatch):
    from broker import cluster as cluster_mod

    ids = iter([b"\xfb" + bytes(15), b"\x00" * 16])   # the first encodes to "-wAA…"
    monkeypatch.setattr(cluster_mod.uuid, "uuid4", lambda: type("U", (), {"bytes": next(ids)}))
    assert cluster_mod._new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"


def test_named_clusters_live_side_by_side_and_are_listed(tmp_path, monkeypatch):
    from broker.cluster import default_data_dir, named_clusters

    monkeypatch.setenv("DOCKET_CLUSTERS_DIR", str(tmp_path))
    local, aggregate = default_data_dir("local"), default_data_dir("aggregate")
    assert local == tmp_path / "local" and aggregate == tmp_path / "aggregate"
    for d, port in ((local, 19092), (aggregate, 29092)):
        cluster = LocalCluster(d)
        cluster.data_dir.mkdir()
        cluster.layout_file.write_text(cluster._plan(1, port).to_json())
    (tmp_path / "stray").mkdir()                       # never started: not a cluster
    clusters = named_clusters()
    assert list(clusters) == ["aggregate", "local"]
    assert clusters["local"].layout().bootstrap_servers == "127.0.0.1:19092"
    assert clusters["local"].layout().cluster_id != clusters["aggregate"].layout().cluster_id


@pytest.mark.parametrize("name", ["Local", "", "a.b", "../x", "x" * 41, "-a"])
def test_a_name_that_cannot_name_a_cluster_is_refused(name):
    from broker.cluster import default_data_dir

    with pytest.raises(BrokerError, match="cannot name a cluster"):
        default_data_dir(name)
