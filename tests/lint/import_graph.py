"""Cycles in an import graph (name -> the names it imports): the module check
(test_code_shape) and the package check (test_layers) share them."""

from __future__ import annotations

from collections import deque


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one module (or one importing itself), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.add(m)
                    if m == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    out.append(component)
    return out


def cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest chain from the component's first module back to itself (breadth first)."""
    start = min(component)
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        m = queue.popleft()
        for child in sorted(graph[m] & component):
            if child == start:
                chain = [m]
                while chain[-1] != start:
                    chain.append(parent[chain[-1]])
                return [*reversed(chain), start]
            if child not in parent:
                parent[child] = m
                queue.append(child)
    raise AssertionError(f"no cycle through {start} in its own component")
