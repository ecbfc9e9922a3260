#pragma once
/**
 * @file The `device_mesh` concept: the specialisations of `DeviceMesh`.
 */
#include <cstddef>
#include <type_traits>

namespace mpar {

/** The device mesh (core/mesh.hpp); declared here so that the concept needs nothing else. */
template <std::size_t TP, std::size_t PP, std::size_t DP, std::size_t EP>
class DeviceMesh;

template <class T>
inline constexpr bool is_device_mesh_v = false;
template <std::size_t A, std::size_t B, std::size_t C, std::size_t D>
inline constexpr bool is_device_mesh_v<DeviceMesh<A, B, C, D>> = true;

namespace detail {

/** @brief Satisfied by `DeviceMesh<...>` specialisations. */
template <class T>
concept device_mesh = is_device_mesh_v<std::remove_cvref_t<T>>;

}  // namespace detail

}  // namespace mpar
