"""gRPC method handlers built from a service descriptor, with request decoding that never raises.

grpcio answers a request its deserializer rejects (a string field that is not UTF-8, a truncated
message) with INTERNAL "Exception deserializing request!", logs a traceback, and, in grpcio 1.85,
keeps memory each time: any client could grow the server without bound. Here a request that
does not decode becomes a marker that the handler turns into INVALID_ARGUMENT naming what was
wrong; everything else is what the generated `add_..._to_server` functions register. Used for
every service the server runs: IdentityService, health and reflection (the last two answer
anyone). All three are asyncio servicers the event loop runs; a method a servicer leaves as a
plain function (health's `List`, unimplemented in its asyncio servicer) runs on the pool.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from identity_api.v1 import identity_service_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["IdentityService"]

_HANDLER_KINDS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler[Any, Any]]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


class Undecodable:
    """A request (or a message of a request stream) that is not a valid protobuf message."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _decoder(message: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    def decode(data: bytes) -> Message | Undecodable:
        try:
            return message.FromString(data)
        except DecodeError as e:
            return Undecodable(str(e) or "cannot be parsed")
    return decode


def _complaint(method: str, message: type[Message], bad: Undecodable) -> str:
    return (f"{method}: the request is not a valid {message.__name__} message ({bad.reason}); "
            "string fields must be UTF-8")


def _guarded(method: str, message: type[Message], behaviour: Callable[..., Any],
             client_streaming: bool) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour):
        return _guarded_async(method, message, behaviour, client_streaming)
    if client_streaming:
        def streaming(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            def checked() -> Iterator[Any]:
                for request in requests:
                    if isinstance(request, Undecodable):
                        # Raises inside the servicer; the call ends with this status.
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                      _complaint(method, message, request))
                    yield request
            return behaviour(checked(), context)
        return streaming

    def unary(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _complaint(method, message, request))
        return behaviour(request, context)
    return unary


def _guarded_async(method: str, message: type[Message], behaviour: Callable[..., Any],
                   client_streaming: bool) -> Callable[..., Any]:
    """`_guarded` for handlers the event loop runs itself (coroutines and async generators)."""

    async def refuse_undecodable(request: Any, context: Any) -> None:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                _complaint(method, message, request))

    if client_streaming:
        async def checked(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for request in requests:
                await refuse_undecodable(request, context)
                yield request

        if inspect.isasyncgenfunction(behaviour):  # a stream both ways (reflection)
            async def stream_to_stream(requests: AsyncIterator[Any],
                                       context: Any) -> AsyncIterator[Any]:
                async for response in behaviour(checked(requests, context), context):
                    yield response
            return stream_to_stream

        async def streaming(requests: AsyncIterator[Any], context: Any) -> Any:
            return await behaviour(checked(requests, context), context)
        return streaming

    if inspect.isasyncgenfunction(behaviour):
        async def unary_to_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await refuse_undecodable(request, context)
            async for response in behaviour(request, context):
                yield response
        return unary_to_stream

    async def unary(request: Any, context: Any) -> Any:
        if isinstance(request, Undecodable):  # inline: every Resolve passes here
            await refuse_undecodable(request, context)
        return await behaviour(request, context)
    return unary


def add_identity_service(servicer: object, server: grpc.Server | grpc.aio.Server) -> None:
    """Register servicer's IdentityService methods on server (as the generated code does)."""
    add_service(servicer, server, SERVICE, pb)


def add_service(servicer: object, server: grpc.Server | grpc.aio.Server, service: Any,
                messages: Any, *, full_name: str | None = None) -> None:
    """Register servicer's methods of `service` (a ServiceDescriptor whose messages are in the
    generated module `messages`) on server; under `full_name` instead of the descriptor's when
    given (a service whose other version has the same messages on the wire)."""
    full_name = full_name or service.full_name
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        request = getattr(messages, method.input_type.name)
        response = getattr(messages, method.output_type.name)
        kind = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(
            _guarded(method.name, request, getattr(servicer, method.name),
                     method.client_streaming),
            request_deserializer=_decoder(request),
            response_serializer=response.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(full_name, handlers),))
    server.add_registered_method_handlers(full_name, handlers)


__all__ = ["SERVICE", "Undecodable", "add_identity_service", "add_service"]
