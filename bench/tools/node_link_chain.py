#!/usr/bin/env python3
"""Writes a networkx node-link training graph of a chain (issue [13]'s long
chains): N forward nodes in a line, a loss, and N backward nodes, shaped as
Checkmate's training graphs are (models/GRAPH_FORMAT.md): forward i reads
forward i-1; backward i reads the gradient from backward i+1 and the
activations forward i and forward i-1 made. 2N+1 nodes in all. Costs and
sizes vary in a fixed pattern so that no two layers are the same.

    bench/tools/node_link_chain.py 20000 > chain40k.json   # 40,001 ops
"""
import json
import sys


def chain(n):
    nodes, links = [], []
    for i in range(n):
        nodes.append({"id": i, "name": f"f{i}", "backward": False,
                      "cost_cpu": 100 + (i * 37) % 300,
                      "cost_ram": (1 << 20) * (1 + (i * 13) % 8)})
    loss = n
    nodes.append({"id": loss, "name": "loss", "backward": True, "cost_cpu": 10, "cost_ram": 1 << 10})
    for i in range(n):
        links.append({"source": i, "target": i + 1})  # forward i -> i+1 (the last -> loss)
    # backward node of forward i: id 2n - i
    for i in range(n - 1, -1, -1):
        b = 2 * n - i
        nodes.append({"id": b, "name": f"f{i}_backward", "backward": True,
                      "cost_cpu": 2 * (100 + (i * 37) % 300),
                      "cost_ram": (1 << 20) * (1 + (i * 13) % 8)})
        links.append({"source": b - 1, "target": b})  # gradient from the layer after (or the loss)
        links.append({"source": i, "target": b})
        if i > 0:
            links.append({"source": i - 1, "target": b})
    return {"directed": True, "multigraph": False, "graph": {"name": f"chain{2 * n + 1}"},
            "nodes": nodes, "links": links}


if __name__ == "__main__":
    json.dump(chain(int(sys.argv[1])), sys.stdout)
